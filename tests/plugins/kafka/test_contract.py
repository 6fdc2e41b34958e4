"""The headrace contract suites, for the kafka source and the (at-least-once) kafka sink."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from headrace.protocols import ReadLimit
from headrace.testing import SinkContract, SourceContract
from tests.plugins.kafka.helpers import consume_all, int_values, produce, unique


class TestKafkaSourceContract(SourceContract):
    connector = "kafka"
    limit = ReadLimit(max_rows=10)
    seed_rows = 30

    @pytest.fixture
    def source_options(self, kafka: Any) -> dict[str, Any]:
        topic = kafka.create_topic(unique("contract-src"), 3)
        return {"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": topic, "startingOffsets": "earliest"}

    @pytest.fixture
    def seed(self, source_options: dict[str, Any]) -> Callable[[int], None]:
        counter = itertools.count()

        def seed(n: int) -> None:
            produce(source_options["kafka.bootstrap.servers"], source_options["subscribe"],
                    [next(counter) for _ in range(n)], partitions=3)  # fmt: skip

        return seed


class TestKafkaSinkContract(SinkContract):
    connector = "kafka"
    transform = "tests.plugins.kafka.helpers:to_kafka_value"
    supports_abort = False  # at-least-once: delivered records cannot be taken back

    @pytest.fixture
    def sink_options(self, kafka: Any) -> dict[str, Any]:
        topic = kafka.create_topic(unique("contract-sink"), 2)
        return {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic, "kafka.linger.ms": 1}

    @pytest.fixture
    def read_back(self, sink_options: dict[str, Any]) -> Callable[[], list[int]]:
        return lambda: int_values(consume_all(sink_options["kafka.bootstrap.servers"], sink_options["topic"], 2))

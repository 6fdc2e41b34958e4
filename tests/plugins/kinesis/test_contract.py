"""The headrace contract suites for the kinesis source and sink, against kinesalite."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from headrace.protocols import ReadLimit
from headrace.testing import SinkContract, SourceContract
from tests.plugins.kinesis.helpers import create_stream, put_values, read_all_values, sink_opts, source_opts


class TestKinesisSourceContract(SourceContract):
    connector = "kinesis"
    limit = ReadLimit(max_rows=7)

    @pytest.fixture
    def source_options(self, kinesis: Any) -> dict[str, Any]:
        return source_opts(kinesis, create_stream(kinesis.client(), shards=2))

    @pytest.fixture
    def seed(self, source_options: dict[str, Any], kinesis: Any) -> Callable[[int], None]:
        client = kinesis.client()
        counter = [0]

        def seed(n: int) -> None:
            put_values(client, source_options["streamName"], range(counter[0], counter[0] + n))
            counter[0] += n

        return seed


class TestKinesisSinkContract(SinkContract):
    connector = "kinesis"
    transform = "tests.plugins.kinesis.helpers:to_kinesis"
    supports_abort = False  # records accepted by PutRecords cannot be taken back
    kill_rows = 600
    kill_rows_per_batch = 150

    @pytest.fixture
    def sink_options(self, kinesis: Any) -> dict[str, Any]:
        return sink_opts(kinesis, create_stream(kinesis.client(), shards=2))

    @pytest.fixture
    def read_back(self, sink_options: dict[str, Any], kinesis: Any) -> Callable[[], list[int]]:
        client = kinesis.client()
        return lambda: read_all_values(client, sink_options["streamName"])

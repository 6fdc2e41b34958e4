"""The core's contract suites, against the real Pub/Sub emulator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from headrace.protocols import ReadLimit
from headrace.testing import SinkContract, SourceContract
from tests.plugins.pubsub.helpers import Topic, drain


class TestPubSubSourceContract(SourceContract):
    connector = "pubsub"
    limit = ReadLimit(max_rows=10)

    @pytest.fixture
    def topic(self, pubsub_emulator: Any) -> Topic:
        return Topic(pubsub_emulator)

    @pytest.fixture
    def source_options(self, topic: Topic) -> dict[str, Any]:
        # the subscription exists before seeding (Pub/Sub delivers only what is published after);
        # a short ack deadline so messages leased by a killed run come back quickly, and an idle
        # timeout longer than it, so the restarted run (trigger availableNow) waits for them
        # instead of ending while a dead run's lease still hides them
        return topic.source_options(topic.subscription(ack_deadline=1), fetchIdleTimeout="2 seconds")

    @pytest.fixture
    def seed(self, topic: Topic) -> Callable[[int], None]:
        def seed(n: int) -> None:
            topic.publish_ints(n)

        return seed


class TestPubSubSinkContract(SinkContract):
    connector = "pubsub"
    transform = "tests.plugins.pubsub.helpers:to_payload"
    supports_abort = False  # published messages cannot be taken back: at-least-once

    @pytest.fixture
    def topic(self, pubsub_emulator: Any) -> Topic:
        return Topic(pubsub_emulator)

    @pytest.fixture
    def sink_options(self, topic: Topic) -> dict[str, Any]:
        return topic.sink_options()

    @pytest.fixture
    def read_back(self, topic: Topic, pubsub_emulator: Any) -> Callable[[], list[int]]:
        sub = topic.subscription()
        seen: list[int] = []

        def read() -> list[int]:
            seen.extend(int(m.message.data) for m in drain(pubsub_emulator, topic.project, sub, idle=0.3))
            return list(seen)

        return read

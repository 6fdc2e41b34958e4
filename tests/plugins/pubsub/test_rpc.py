"""The source's direct Pull / Acknowledge / ModifyAckDeadline calls (``_rpc.SubscriberCalls``) on
the real emulator: what they return and acknowledge, and that errors are the client library's."""

from __future__ import annotations

from typing import Any, cast

import pytest
from google.api_core import exceptions as gexc

from headrace_pubsub._rpc import SubscriberCalls
from tests.plugins.pubsub.helpers import Topic, drain, wait_for


@pytest.fixture
def topic(pubsub_emulator: Any) -> Topic:
    return Topic(pubsub_emulator)


@pytest.fixture
def client(pubsub_emulator: Any) -> Any:
    c = pubsub_emulator.subscriber()
    yield c
    c.close()


def _pull_all(calls: SubscriberCalls, n: int) -> list[Any]:
    got: list[Any] = []
    wait_for(lambda: cast(Any, got.extend(calls.pull(1000))) or len(got) >= n,
             timeout=20, what=f"{n} messages")
    return got


def test_pull_then_acknowledge(topic: Topic, client: Any) -> None:
    sub = topic.subscription(ack_deadline=10)
    calls = SubscriberCalls(client, f"projects/{topic.project}/subscriptions/{sub}", timeout=30)
    values = topic.publish_ints(250)
    got = _pull_all(calls, 250)
    assert sorted(int(m.message.data) for m in got) == values
    assert all(m.ack_id and m.message.message_id and m.message.publish_time.seconds for m in got)
    for i in range(0, len(got), 100):
        calls.acknowledge([m.ack_id for m in got[i : i + 100]])
    assert not drain(topic.emulator, topic.project, sub, idle=1.2), "acknowledged messages came back"


def test_modify_ack_deadline_zero_hands_messages_back(topic: Topic, client: Any) -> None:
    sub = topic.subscription(ack_deadline=60)
    calls = SubscriberCalls(client, f"projects/{topic.project}/subscriptions/{sub}", timeout=30)
    values = topic.publish_ints(5)
    got = _pull_all(calls, 5)
    calls.modify_ack_deadline([m.ack_id for m in got], 30)  # extended: still held
    assert calls.pull(1000) == []
    calls.modify_ack_deadline([m.ack_id for m in got], 0)  # handed back: delivered again at once
    again = _pull_all(calls, 5)
    assert sorted(int(m.message.data) for m in again) == values
    calls.acknowledge([m.ack_id for m in again])


def test_errors_are_the_client_librarys(topic: Topic, client: Any) -> None:
    calls = SubscriberCalls(client, f"projects/{topic.project}/subscriptions/no-such-sub", timeout=30)
    with pytest.raises(gexc.NotFound):
        calls.pull(10)
    with pytest.raises(gexc.GoogleAPICallError):
        calls.acknowledge(["not-an-ack-id"])

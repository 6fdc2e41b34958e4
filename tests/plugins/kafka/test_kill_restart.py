"""SIGKILL a kafka pipeline mid-batch, restart it, check the output (the contract suites cover
every crash point at batch 0 with a small topic; these use several partitions and batches)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from headrace.connectors.files import read_files
from headrace.testing import run_until_done
from tests.plugins.kafka.helpers import consume_all, int_values, produce, unique

ROWS = 3000


def source(kafka: Any, topic: str) -> dict[str, Any]:
    return {"format": "kafka", "options": {"kafka.bootstrap.servers": kafka.bootstrap_servers, "subscribe": topic,
                                           "startingOffsets": "earliest", "maxOffsetsPerTrigger": 500}}  # fmt: skip


def test_kafka_to_files_is_exactly_once_across_kills(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.create_topic(unique("kill"), 3)
    produce(kafka.bootstrap_servers, topic, range(ROWS), partitions=3)
    spec = {
        "source": source(kafka, topic),
        "transform": "tests.plugins.kafka.helpers:kafka_to_int",
        "sink": {"format": "files", "options": {"path": str(tmp_path / "out"), "format": "arrow"}},
        "checkpoint": str(tmp_path / "chk"),
    }
    runs = run_until_done(spec, crashes=["mid_write:1", "after_sink_commit:2"], timeout=90)
    assert all(r.killed for r in runs[:2])
    t = read_files(str(tmp_path / "out"), "arrow")
    values = t.column("value").to_pylist()
    assert sorted(values) == list(range(ROWS)), f"{len(values) - ROWS} extra rows"


def test_kafka_to_kafka_is_at_least_once_across_kills(kafka: Any, tmp_path: Path) -> None:
    src, dst = kafka.create_topic(unique("kill-in"), 3), kafka.create_topic(unique("kill-out"), 2)
    produce(kafka.bootstrap_servers, src, range(ROWS), partitions=3)
    spec = {
        "source": source(kafka, src),
        "transform": "tests.plugins.kafka.helpers:select_key_value",
        "sink": {"format": "kafka", "options": {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": dst}},
        "checkpoint": str(tmp_path / "chk"),
    }
    # a whole run takes about 1 s here (0.7 s of it starting Python): the random kill lands mid-run
    runs = run_until_done(spec, crashes=["before_sink_commit:1"], random_kills=1, kill_window=(0.75, 1.1), timeout=90)
    assert runs[0].killed
    got = int_values(consume_all(kafka.bootstrap_servers, dst, 2, expect=ROWS))
    assert set(got) == set(range(ROWS))  # at least once; replayed batches may repeat
    assert len(got) <= ROWS + 2 * 500, "more duplicates than the two replayed batches"

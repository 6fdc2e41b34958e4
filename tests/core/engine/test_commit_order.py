"""The commit order of a run (``CommitOrder``) on a real checkpoint: a batch's state writes are
durable before its marker, its sources are told only once the marker is durable and only when
settled, a marker written whole in the background is visible before the next sink commit, and a
real-time batch's marker and source commit follow its state at once."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from headrace.checkpoint import Checkpoint, OffsetEntry
from headrace.engine.commits import CommitOrder
from headrace.helpers.crash import CrashHook


class Journal:
    """What happened, in order: state writes made durable, source commits."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()

    def add(self, event: str) -> None:
        with self.lock:
            self.events.append(event)


class StateWrite:
    def __init__(self, journal: Journal, name: str) -> None:
        self.journal, self.name = journal, name

    def result(self, timeout: float | None = None) -> None:
        self.journal.add(f"state {self.name}")


class Source:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def commit(self, end: Any) -> None:
        self.journal.add(f"source {end['v']}")


def order_on(tmp_path: Path) -> tuple[CommitOrder, Checkpoint, Journal]:
    cp = Checkpoint(str(tmp_path))
    cp.open(name="q", sources=[{"connector": "rate"}], sink={"connector": "noop"})
    journal = Journal()
    return CommitOrder(cp, (Source(journal),), CrashHook(), max_pending=10), cp, journal  # type: ignore[arg-type]


def test_state_before_a_linked_marker_and_sources_only_when_settled(tmp_path: Path) -> None:
    order, cp, journal = order_on(tmp_path)
    (wal,) = order.write_ahead([OffsetEntry(0, [{"v": 0}], [{"v": 5}], 1)])
    order.before_sink_commit(0, wal=wal, settle_dead_letters=lambda: journal.add(
        f"dead letters, offsets durable: {(tmp_path / 'offsets' / '0').exists()}"))  # fmt: skip
    order.commit(0, [StateWrite(journal, "0")], {}, [{"v": 5}])
    assert journal.events == ["dead letters, offsets durable: True", "state 0"]
    journal.events.clear()  # the state first; the marker visible; no source told yet
    assert (tmp_path / "commits" / "0").exists()
    order.settle()
    assert journal.events == ["source 5"]
    assert cp.committed_ids() == [0]
    cp.close()


def test_a_marker_written_whole_follows_its_state_and_is_visible_before_the_next_sink_commit(tmp_path: Path) -> None:
    order, cp, journal = order_on(tmp_path)
    for n in range(2):
        (wal,) = order.write_ahead([OffsetEntry(n, [{"v": n}], [{"v": n + 1}], 1)])
        order.before_sink_commit(n, wal=wal, settle_dead_letters=lambda: None)  # batch 1: marker 0 visible
        if n == 1:
            assert json.loads((tmp_path / "commits" / "0").read_bytes())["eventTimeMaxMs"] == {"0": 7}
        order.commit(n, [StateWrite(journal, str(n))], {"eventTimeMaxMs": {"0": 7 + n}}, [{"v": n + 1}])
    order.settle()
    events = journal.events  # each batch's state before its source; the sources in batch order, once
    assert sorted(events) == ["source 1", "source 2", "state 0", "state 1"]
    assert events.index("state 0") < events.index("source 1") < events.index("source 2")
    assert events.index("state 1") < events.index("source 2")
    assert json.loads((tmp_path / "commits" / "1").read_bytes())["eventTimeMaxMs"] == {"0": 8}
    cp.close()


def test_a_real_time_batch_commits_its_marker_and_sources_at_once(tmp_path: Path) -> None:
    order, cp, journal = order_on(tmp_path)
    order.begin_real_time(OffsetEntry(0, [{"v": 0}], [None], 1, real_time=True))
    assert cp.read_offsets(0).ends == [None]
    order.end_real_time(OffsetEntry(0, [{"v": 0}], [{"v": 3}], 1, real_time=True))
    order.before_sink_commit(0, wal=None, settle_dead_letters=lambda: None)
    order.commit_real_time(0, [StateWrite(journal, "0")], {}, [{"v": 3}])
    assert journal.events == ["state 0", "source 3"] and cp.committed_ids() == [0]
    cp.close()


def test_batches_planned_ahead_and_not_run_are_forgotten(tmp_path: Path) -> None:
    order, cp, _ = order_on(tmp_path)
    futures = order.write_ahead([OffsetEntry(n, [{"v": n}], [{"v": n + 1}], 1) for n in range(3)])
    for f in futures:
        f.result(10)
    for n in (2, 1):
        order.forget_planned(n)
    assert cp.batch_ids() == [0]
    cp.close()

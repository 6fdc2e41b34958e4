"""Deferred ``Source.commit``: in batch order, each batch once, only once its marker is durable;
a marker waiting too long is flushed; too many waiting ones are waited for."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from headrace.engine.commits import SourceCommits


class Recorder:
    def __init__(self) -> None:
        self.ends: list[Any] = []

    def commit(self, end: Any) -> None:
        self.ends.append(end)


def _done() -> Future[None]:
    f: Future[None] = Future()
    f.set_result(None)
    return f


def test_sources_are_committed_in_order_and_only_once_the_marker_is_durable() -> None:
    src = Recorder()
    flushes: list[int] = []
    sc = SourceCommits([src], max_pending=10, flush=lambda: flushes.append(1), max_delay=60)  # type: ignore[list-item]
    slow: Future[None] = Future()
    sc.add(_done(), [{"n": 1}])
    sc.add(slow, [{"n": 2}])
    sc.add(_done(), [{"n": 3}])  # durable, but after a batch that is not: waits its turn
    sc.settle()
    assert src.ends == [{"n": 1}] and len(sc) == 2 and flushes == []
    slow.set_result(None)
    sc.settle()
    assert src.ends == [{"n": 1}, {"n": 2}, {"n": 3}] and len(sc) == 0


def test_an_old_marker_is_flushed_and_too_many_are_waited_for() -> None:
    src = Recorder()
    pending: list[Future[None]] = []

    def flush() -> None:
        for f in pending:
            if not f.done():
                f.set_result(None)

    sc = SourceCommits([src], max_pending=2, flush=flush, max_delay=0.0)  # type: ignore[list-item]
    for n in range(2):
        pending.append(Future())
        sc.add(pending[-1], [{"n": n}])
    sc.settle()  # the oldest waited longer than max_delay: flushed, not waited for
    assert all(f.done() for f in pending) and src.ends == []
    sc.settle()
    assert src.ends == [{"n": 0}, {"n": 1}]
    sc2 = SourceCommits([src], max_pending=1, flush=flush, max_delay=60)  # type: ignore[list-item]
    for n in range(3):
        pending.append(Future())
        sc2.add(pending[-1], [{"n": 10 + n}])
    sc2.settle()  # three waiting, one allowed: flushed and waited for instead of returning
    assert src.ends[-3:] == [{"n": 10}, {"n": 11}, {"n": 12}] and len(sc2) == 0

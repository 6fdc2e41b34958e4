"""Whether a micro-batch's partitions are read by reader threads or one after the other on the
query's thread, chosen per query by measuring both.

Reader threads pay off when a partition's read waits (on a broker, a file system, a server) or
runs native code that releases the GIL (Parquet decoding, compression). They cost when the
reads hold the GIL (numpy and Python per chunk, as in the rate sources and most stateless and
partial-aggregation steps): the threads then take turns on the GIL, and each hand-off is a
context switch. On a 2-core machine a 2-partition windowed aggregation ran ~12% slower with a
reader thread than on the query thread alone (docs/performance.md).

Neither can be told for sure from outside a read, so :class:`ReadMode` starts with what the
sources say (``Source.reads_wait``: reader threads when any source's reads wait on something
outside the process, the query's thread when every source generates or copies its rows in
process), then measures: after 16 batches one batch is read the other way (a probe), and the
cheaper mode per input row is kept. The other mode is probed again 16 batches later, then
twice as many each time it loses again (at most 1,024), so a query spends at most one batch
in 16, then far fewer, in the slower mode, and a short query (fewer than 17 batches) runs as
its sources say. Both modes give the same rows in the same order (partition order); only the
threads that read them differ.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ReadMode"]

log = logging.getLogger(__name__)

_MIN_ROWS = 1_000  # smaller batches are dominated by fixed costs: not measured


@dataclass
class ReadMode:
    """The read mode of one query's micro-batches. ``parallel()`` is asked before each batch
    that has several partitions; ``record()`` is told how long its read and write took. Used by
    the query's thread only (not thread-safe); nothing in it is pickled or persisted."""

    first_probe_after: int = 16
    max_probe_after: int = 1024
    margin: float = 0.05  # the other mode must be this much cheaper per row to take over
    parallel_mode: bool = True
    _cost: dict[bool, float] = field(default_factory=dict)  # seconds per input row, per mode
    _since_switch_or_probe: int = 0
    _probe_after: int = 0
    _probing: bool = False

    def __post_init__(self) -> None:
        self._probe_after = self.first_probe_after

    @classmethod
    def for_sources(cls, sources: Sequence[Any]) -> ReadMode:
        """The read mode of a query reading ``sources`` (see ``Source.reads_wait``). Called
        once per query run, after its sources are built."""
        return cls(parallel_mode=any(getattr(s, "reads_wait", True) for s in sources))

    def parallel(self) -> bool:
        """Whether the next batch's partitions go to reader threads. Called once per batch
        with more than one partition, before it is read."""
        if self._cost and self._since_switch_or_probe >= self._probe_after:
            self._probing = True
            return not self.parallel_mode
        self._probing = False
        return self.parallel_mode

    def record(self, parallel: bool, rows: int, seconds: float) -> None:
        """A batch of ``rows`` input rows read (in the mode ``parallel``) and written in
        ``seconds``. Called once per batch that asked :meth:`parallel`, after the sink's write."""
        if rows < _MIN_ROWS or seconds <= 0:
            return
        per_row = seconds / rows
        old = self._cost.get(parallel)
        self._cost[parallel] = per_row if old is None else (old + per_row) / 2
        if not self._probing:
            self._since_switch_or_probe += 1
            return
        self._probing = False
        self._since_switch_or_probe = 0
        mine, other = self._cost.get(self.parallel_mode), self._cost[parallel]
        if parallel != self.parallel_mode and mine is not None and other < mine * (1 - self.margin):
            log.debug("reading partitions %s (%.3g s a row against %.3g)",
                      "in reader threads" if parallel else "on the query thread", other, mine)  # fmt: skip
            self.parallel_mode = parallel
            self._probe_after = self.first_probe_after
        else:
            self._probe_after = min(max(self._probe_after * 2, self.first_probe_after), self.max_probe_after)

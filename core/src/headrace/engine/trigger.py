"""When a query's batches run: its trigger.

``SourcePlan`` (now :mod:`headrace.engine.source_plan`) and ``Transform`` (now
:mod:`headrace.transforms.stateless`) stay importable from here for one release."""

from __future__ import annotations

from dataclasses import dataclass

from headrace.engine.source_plan import SourcePlan
from headrace.transforms.stateless import Transform

__all__ = ["SourcePlan", "Transform", "Trigger"]


@dataclass(frozen=True)
class Trigger:
    """When batches run. Build with ``DataStreamWriter.trigger(...)``.

    ``kind`` is one of ``default`` (next batch as soon as the last ends), ``processing_time``
    (every ``interval`` seconds), ``once`` (one batch of everything available, then stop),
    ``available_now`` (everything available at start, in rate-limited batches, then stop) and
    ``real_time`` (long-running batches of ``interval`` seconds, each record processed as it
    arrives).
    """

    kind: str = "default"
    interval: float = 0.0

    def __str__(self) -> str:
        return self.kind + (f"({self.interval:g}s)" if self.interval else "")

"""What a query is made of before it runs: its trigger and its source plans."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from headrace.options import Options

__all__ = ["SourcePlan", "Transform", "Trigger"]

Transform = Callable[[pa.Table], pa.Table]


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


@dataclass
class SourcePlan:
    """A source as the user declared it: connector, validated options, the class to build."""

    connector: str
    options: Options
    source_class: type
    user_schema: pa.Schema | None = None
    path: str | None = None
    #: the options as given (path included), for an engine that parses them itself (Spark)
    raw_options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def describe(self) -> str:
        from headrace.errors import redact_url

        return f"{self.connector}" + (f"[{redact_url(self.path)}]" if self.path else "")

    def __repr__(self) -> str:
        return f"SourcePlan({self.describe()}, options={self.options!r})"

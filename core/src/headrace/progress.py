"""Progress reports shaped like Spark's ``StreamingQueryProgress``, and a one-line rendering."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headrace._words import counted

__all__ = ["QueryProgress", "SinkProgress", "SourceProgress", "latency_summary", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def latency_summary(values: Sequence[float]) -> dict[str, float]:
    """``{"P0", "P50", "P90", "P95", "P99", "P100"}`` of a list of milliseconds (Spark's RTM shape)."""
    ordered = sorted(values)
    return {f"P{q}": round(percentile(ordered, q), 3) for q in (0, 50, 90, 95, 99, 100)}


def _rate(rows: int, seconds: float) -> float:
    return round(rows / seconds, 1) if seconds > 0 else 0.0


@dataclass
class SourceProgress:
    description: str
    start_offset: Any
    end_offset: Any
    latest_offset: Any
    num_input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "startOffset": self.start_offset,
            "endOffset": self.end_offset,
            "latestOffset": self.latest_offset,
            "numInputRows": self.num_input_rows,
            "inputRowsPerSecond": self.input_rows_per_second,
            "processedRowsPerSecond": self.processed_rows_per_second,
            "metrics": dict(self.metrics),
        }


@dataclass
class SinkProgress:
    description: str
    num_output_rows: int
    metrics: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"description": self.description, "numOutputRows": self.num_output_rows, "metrics": dict(self.metrics)}


@dataclass
class QueryProgress:
    """One batch's report. ``to_dict()`` gives Spark's camelCase keys; ``to_json()`` the JSON."""

    id: str
    run_id: str
    name: str
    timestamp: dt.datetime
    batch_id: int
    num_input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    duration_ms: dict[str, int]
    sources: list[SourceProgress]
    sink: SinkProgress
    batch_duration_ms: int = 0
    latencies: dict[str, dict[str, float]] | None = None
    # Spark's eventTime ({"watermark", "min", "max", "avg"} as ISO-8601 UTC; empty without a
    # watermark) and stateOperators (one entry per stateful operator: numRowsTotal, ...).
    event_time: dict[str, str] = field(default_factory=dict)
    state_operators: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        *,
        id: str,
        run_id: str,
        name: str,
        batch_id: int,
        started: float,
        durations: dict[str, float],
        previous_trigger: float | None,
        sources: Sequence[tuple[str, Any, Any, Any, int, Mapping[str, Any]]],
        sink: tuple[str, int, Mapping[str, Any]],
        latencies: dict[str, Sequence[float]] | None = None,
        event_time: Mapping[str, str] | None = None,
        state_operators: Sequence[Mapping[str, Any]] | None = None,
    ) -> QueryProgress:
        """Assemble a report from the raw numbers the engine measured (seconds). Called once
        per batch on the query's thread: kept to plain arithmetic and a few allocations."""
        # Spark's processedRowsPerSecond: rows / the trigger's duration in whole milliseconds
        # (at least 1), the same figure durationMs.triggerExecution reports
        total_ms = round(durations.get("triggerExecution", 0.0) * 1000)
        total = max(1, total_ms) / 1000
        # Spark's inputRowsPerSecond: rows / time since the previous trigger's start; a run's
        # first batch has no previous trigger, so its input rate is 0 (as Spark reports it),
        # not its processing rate (which would be a spike that dwarfs every later input rate)
        since_last = (started - previous_trigger) if previous_trigger else math.inf
        rows = 0
        srcs = []
        for desc, start, end, latest, n, metrics in sources:
            rows += n
            srcs.append(SourceProgress(desc, start, end, latest, n, _rate(n, since_last), _rate(n, total), metrics))
        return cls(
            id,
            run_id,
            name,
            dt.datetime.fromtimestamp(started, tz=dt.UTC),
            batch_id,
            rows,
            _rate(rows, since_last),
            _rate(rows, total),
            {k: round(v * 1000) for k, v in durations.items()},
            srcs,
            SinkProgress(*sink),
            total_ms,
            {k: latency_summary(v) for k, v in latencies.items()} if latencies else None,
            dict(event_time) if event_time else {},
            [dict(m) for m in state_operators] if state_operators else [],
        )

    def _timestamp_text(self) -> str:
        """``timestamp`` as Spark writes it (ISO-8601, milliseconds, ``Z``); computed once per
        timestamp (``to_dict`` runs several times per batch: history, listeners, callbacks)."""
        cached = self.__dict__.get("_ts_text")
        if cached is not None and cached[0] is self.timestamp:
            return cached[1]
        text = self.timestamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        self.__dict__["_ts_text"] = (self.timestamp, text)
        return text

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "runId": self.run_id,
            "name": self.name,
            "timestamp": self._timestamp_text(),
            "batchId": self.batch_id,
            "batchDuration": self.batch_duration_ms,
            "numInputRows": self.num_input_rows,
            "inputRowsPerSecond": self.input_rows_per_second,
            "processedRowsPerSecond": self.processed_rows_per_second,
            "durationMs": dict(self.duration_ms),
            "sources": [s.to_dict() for s in self.sources],
            "sink": self.sink.to_dict(),
            "stateOperators": [dict(m) for m in self.state_operators],
        }
        if self.event_time:
            d["eventTime"] = dict(self.event_time)
        if self.latencies is not None:
            d["latencies"] = self.latencies
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def backlog(self) -> dict[str, Any]:
        """Backlog metrics of all sources merged (numFilesOutstanding, lag, ...)."""
        out: dict[str, Any] = {}
        for s in self.sources:
            for k, v in s.metrics.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and isinstance(out.get(k, 0), int | float):
                    out[k] = out.get(k, 0) + v
                else:
                    out[k] = v
        return out

    def line(self) -> str:
        """One human line: ``batch 3: 64,000 rows in 45 ms (1.4M rows/s) backlog: ...``."""
        backlog = ", ".join(
            f"{k}={v}" for k, v in self.backlog().items() if isinstance(v, int | float) and not isinstance(v, bool)
        )
        text = (
            f"[{self.name or self.id[:8]}] batch {self.batch_id}: {counted(self.num_input_rows, 'row')} in "
            f"{self.batch_duration_ms} ms ({_human(self.processed_rows_per_second)} rows/s)"
        )
        skipped = self.sink.metrics.get("numRowsSkipped")
        if isinstance(skipped, int) and not isinstance(skipped, bool) and skipped > 0:
            text += f"; {counted(skipped, 'row')} skipped by the sink (batch already committed)"
        if backlog:
            text += f"; backlog {backlog}"
        if self.latencies:
            e2e = self.latencies.get("e2eLatencyMs")
            if e2e:
                text += f"; e2e p50 {e2e['P50']:.1f} ms p99 {e2e['P99']:.1f} ms"
        return text


def _human(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"

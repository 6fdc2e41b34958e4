"""Drive a stateful operator the way the engine does (open, begin, process per chunk, finish,
close), with Spark's watermark (max event time of earlier batches minus the delay), so the
operator tests can compare its output with DuckDB over all input at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace.transforms.operator import BatchInfo, Operator, OperatorContext


@dataclass
class Run:
    outputs: list[pa.Table | None] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    watermarks: list[int | None] = field(default_factory=list)
    next_batch: int = 0
    max_event_ms: int | None = None

    def all_rows(self) -> list[dict[str, Any]]:
        return [r for t in self.outputs if t is not None for r in t.to_pylist()]


def run_batches(
    make: Callable[[], Operator],
    batches: Sequence[pa.Table],
    *,
    state_path: str,
    backend: str,
    mode: str,
    watermark: tuple[str, int] | None = None,
    chunks: int = 1,
    real_time: bool = False,
    run: Run | None = None,
    stop_after: int | None = None,
    schema: pa.Schema | None = None,
) -> Run:
    """Run ``batches`` (one micro-batch each, split into ``chunks`` chunks) through a fresh
    operator from ``make``; ``run`` continues an earlier run (a restart). ``watermark`` is
    (column, delay in ms). ``stop_after`` stops (as a crash would) after that many batches."""
    run = run or Run()
    op = make()
    op.output_schema(schema if schema is not None else batches[0].schema)
    op.open(OperatorContext(index=0, state_path=state_path, state_backend=backend, output_mode=mode,
                            real_time=real_time, retain=100))  # fmt: skip
    try:
        for i, t in enumerate(batches):
            if stop_after is not None and i >= stop_after:
                break
            wm = None
            if watermark is not None and run.max_event_ms is not None:
                wm = run.max_event_ms - watermark[1]
            info = BatchInfo(run.next_batch, watermark_ms=wm, real_time=real_time)
            op.begin(info)
            outs = []
            step = max(1, -(-t.num_rows // chunks))
            for lo in range(0, max(t.num_rows, 1), step):
                o = op.process(t.slice(lo, step), info)
                if o is not None:
                    outs.append(o)
            o = op.finish(info)
            if o is not None:
                outs.append(o)
            run.outputs.append(pa.concat_tables(outs) if outs else None)
            run.metrics.append(dict(op.metrics()))
            run.watermarks.append(wm)
            run.next_batch += 1
            if watermark is not None and t.num_rows:
                mx_ms = _to_ms(t.column(watermark[0]))
                if mx_ms is not None:
                    run.max_event_ms = mx_ms if run.max_event_ms is None else max(run.max_event_ms, mx_ms)
    finally:
        op.close()
    return run


def _to_ms(col: pa.ChunkedArray) -> int | None:
    us = col.cast(pa.timestamp("us", tz=getattr(col.type, "tz", None))).combine_chunks().view(pa.int64())
    m = pc.max(us).as_py()
    return None if m is None else m // 1000

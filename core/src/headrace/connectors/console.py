"""``console`` (prints each batch) and ``noop`` (discards it) sinks."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa

from headrace.protocols import CommitMessage, Sink

__all__ = ["ConsoleSink", "NoopSink"]


class ConsoleSink(Sink):
    """Prints ``-------- Batch: N --------`` and the first ``numRows`` rows, as Spark does."""

    output_modes = ("append", "update", "complete")
    supports_real_time = True

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage | None:
        limit = int(self.options["numRows"])
        truncate = bool(self.options["truncate"])
        rows: list[dict[str, object]] = []
        total = 0
        schema = self.context.schema  # an empty batch still shows its columns
        for b in data:
            schema = b.schema
            total += b.num_rows
            if len(rows) < limit:
                rows.extend(b.slice(0, limit - len(rows)).to_pylist())
        out = [f"-------------------------------------------\nBatch: {batch_id}\n-------------------------------------------"]
        if schema is not None:
            cols = schema.names

            def cell(v: object) -> str:
                s = "null" if v is None else str(v)
                return s[:17] + "..." if truncate and len(s) > 20 else s

            table = [[cell(r[c]) for c in cols] for r in rows]
            widths = [max(len(c), *(len(t[i]) for t in table)) if table else len(c) for i, c in enumerate(cols)]
            sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
            out += [sep, "|" + "|".join(f" {c.rjust(w)} " for c, w in zip(cols, widths, strict=True)) + "|", sep]
            out += ["|" + "|".join(f" {v.rjust(w)} " for v, w in zip(t, widths, strict=True)) + "|" for t in table]
            out.append(sep)
            if total > len(rows):
                out.append(f"only showing top {len(rows)} of {total} rows")
        sys.stdout.write("\n".join(out) + "\n\n")
        sys.stdout.flush()
        return None

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        return None


class NoopSink(Sink):
    """Consumes and discards every row (for benchmarks: measures the source and engine)."""

    idempotent_commit = True
    supports_real_time = True
    output_modes = ("append", "update", "complete")

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage | None:
        for _ in data:
            pass
        return None

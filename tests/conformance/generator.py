"""Seeded input micro-batches for the conformance harness.

``generate(seed)`` returns the batches both engines read (one parquet file per trigger): event
times that mostly move forward, with nulls, NaN, duplicates (within a batch and across
batches), out-of-order rows, rows late by less and by more than the watermark delay, rows
exactly at window edges and exactly at the watermark, an empty batch and a one-row batch.
Everything derives from the seed, so a failure is reproduced by its seed alone.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

__all__ = ["DDL", "DELAY_S", "GAP_S", "SCHEMA", "SLIDE_S", "STATIC_DDL", "STATIC_SCHEMA", "WINDOW_S", "Input",
           "generate"]  # fmt: skip

# the query parameters the catalogue uses; the generator aims its edge cases at them
DELAY_S = 5  # watermark delay
WINDOW_S = 10  # tumbling window length (and sliding window length)
SLIDE_S = 5  # sliding window slide
GAP_S = 4  # session window gap

DDL = "ts TIMESTAMP, k STRING, id BIGINT, v DOUBLE, n BIGINT"
SCHEMA = pa.schema([
    pa.field("ts", pa.timestamp("us", tz="UTC")),
    pa.field("k", pa.string()),
    pa.field("id", pa.int64()),
    pa.field("v", pa.float64()),
    pa.field("n", pa.int64()),
])  # fmt: skip
STATIC_DDL = "k STRING, sk STRING, label STRING, weight BIGINT"
STATIC_SCHEMA = pa.schema([
    pa.field("k", pa.string()),
    pa.field("sk", pa.string()),
    pa.field("label", pa.string()),
    pa.field("weight", pa.int64()),
])  # fmt: skip

T0_US = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp()) * 1_000_000
_KEYS = ["a", "b", "c", None]


@dataclass(frozen=True)
class Input:
    """One seed's input: ``batches`` (one table per trigger), ``second`` (the other stream of a
    union, as many batches) and ``static`` (the static side of joins)."""

    seed: int
    batches: tuple[pa.Table, ...]
    second: tuple[pa.Table, ...]
    static: pa.Table

    def describe(self) -> str:
        sizes = ", ".join(str(b.num_rows) for b in self.batches)
        return f"seed {self.seed}: {len(self.batches)} batches of [{sizes}] rows"


class _Stream:
    """Event times for one stream: a frontier moving forward, the max seen so far by the
    batches before, and the watermark those batches give."""

    def __init__(self, rnd: random.Random, id_offset: int) -> None:
        self.rnd = rnd
        self.frontier_s = rnd.randint(WINDOW_S, 3 * WINDOW_S)
        self.max_seen_s: float | None = None
        self.prev_max_seen_s: float | None = None
        self.rows: list[tuple[int | None, str | None, int, float | None, int | None]] = []
        self.id_offset = id_offset

    def _row(self, ts_s: float) -> tuple[int | None, str | None, int, float | None, int | None]:
        r = self.rnd
        ts_us: int | None = T0_US + round(ts_s * 1_000_000)
        if r.random() < 0.04:
            ts_us = None  # a row without event time
        v: float | None = r.choice([None, float("nan"), round(r.uniform(-50, 50), 3), float(r.randint(0, 9))])
        n = None if r.random() < 0.15 else r.randint(-5, 20)
        return (ts_us, r.choice(_KEYS), self.id_offset + r.randint(0, 6), v, n)

    def batch(self, size: int, *, plant: bool = False) -> list[tuple[int | None, str | None, int, float | None, int | None]]:
        """``size`` rows; with ``plant``, the first ones are sure to be the edge cases (late by
        more and by less than the delay, at the watermark, at a window edge, between the two
        last watermarks) and to hold NULL and NaN values."""
        r = self.rnd
        self.frontier_s += r.randint(2, 2 * WINDOW_S)
        wm = None if self.max_seen_s is None else self.max_seen_s - DELAY_S
        prev_wm = None if self.prev_max_seen_s is None else self.prev_max_seen_s - DELAY_S
        rows = []
        planted = ["late_big", "at_watermark", "late_small", "edge", "between"] if plant and wm is not None else []
        for i in range(size):
            kinds = ["fresh", "fresh", "fresh", "edge", "dup"]
            if wm is not None:
                kinds += ["late_small", "late_big", "at_watermark", "between"]
            kind = planted[i] if i < len(planted) else r.choice(kinds)
            if kind == "dup" and self.rows:
                rows.append(r.choice(self.rows))
                continue
            ts: float
            if kind == "edge":
                ts = (self.frontier_s - r.randint(0, WINDOW_S)) // SLIDE_S * SLIDE_S
            elif kind == "late_small" and wm is not None:
                ts = wm + r.randint(1, DELAY_S - 1)
            elif kind == "late_big" and wm is not None:
                ts = wm - r.randint(1, 2 * WINDOW_S)
            elif kind == "at_watermark" and wm is not None:
                ts = wm
            elif kind == "between" and wm is not None:
                # between the previous batch's watermark and this one's: Spark keeps it, or at an edge
                lo = prev_wm if prev_wm is not None else wm - WINDOW_S
                ts = r.uniform(lo, wm) if r.random() < 0.5 else lo
            else:
                ts = self.frontier_s - r.randint(0, 3)
            if r.random() < 0.2:
                ts += r.randint(1, 999_999) / 1_000_000
            row = self._row(ts)
            if plant and i < 4:  # NULL n, NaN v, NULL v, NULL k
                row = (row[0], None if i == 3 else row[1], row[2], float("nan") if i == 1 else None if i == 2 else row[3],
                       None if i == 0 else row[4])  # fmt: skip
            rows.append(row)
        if len(rows) > 1 and (plant or r.random() < 0.3):
            rows.append(r.choice(rows))  # a duplicate within the batch
        r.shuffle(rows)
        self.rows.extend(rows)
        if rows:
            self.prev_max_seen_s = self.max_seen_s
            times = [row[0] for row in rows if row[0] is not None]
            if not times:
                return rows
            top = max(times)
            top_s = (top - T0_US) / 1_000_000
            self.max_seen_s = top_s if self.max_seen_s is None else max(self.max_seen_s, top_s)
        return rows


def _table(rows: list[tuple[int | None, str | None, int, float | None, int | None]]) -> pa.Table:
    cols: list[Any] = list(zip(*rows, strict=True)) if rows else [[] for _ in SCHEMA]
    return pa.table([pa.array(list(c), type=f.type) for c, f in zip(cols, SCHEMA, strict=True)], schema=SCHEMA)


def generate(seed: int, *, batches: int | None = None) -> Input:
    """The input of ``seed``: 5-9 batches (or ``batches``), one of them empty and one with one
    row (never the first: a query's first batch sets the watermark Spark and headrace start
    from), the others 2-9 rows."""
    rnd = random.Random(seed)
    count = batches if batches is not None else rnd.randint(5, 9)
    sizes = [rnd.randint(2, 9) for _ in range(count)]
    if count >= 3:
        empty, single = rnd.sample(range(1, count), 2)
        sizes[empty], sizes[single] = 0, 1
    first, second = _Stream(rnd, 0), _Stream(rnd, 100)
    # the edge cases planted in the largest batch after the first two (the watermark is known there)
    plant = max(range(2, count), key=lambda i: sizes[i]) if count > 2 else -1
    main = tuple(_table(first.batch(s, plant=i == plant)) for i, s in enumerate(sizes))
    other = tuple(_table(second.batch(max(0, s - rnd.randint(0, 2)))) for s in sizes)
    static = pa.table(
        {"k": ["a", "b", "b", None, "d"], "sk": ["a", "b", "b", "c", None], "label": ["A", "B1", "B2", "N", "D"],
         "weight": [1, 2, 3, 4, None]},
        schema=STATIC_SCHEMA,
    )  # fmt: skip
    return Input(seed, main, other, static)

"""``DropDuplicatesOperator``: streaming ``drop_duplicates(*cols)`` and
``drop_duplicates_within_watermark(*cols)`` with Spark's semantics.

- ``drop_duplicates(cols)``: the first row of each key (the columns, all of them when none
  are given) passes, later ones are dropped. When the watermark column is among the keys,
  rows older than the watermark for late events (the previous batch's, as in Spark since
  3.4) are dropped as late and a key's state is removed once this batch's watermark passes
  its event time; otherwise the state keeps every key seen (unbounded, as in
  Spark).
- ``drop_duplicates_within_watermark(cols)`` (Spark 3.5): the event-time column need not be a
  key; a key's state expires at its first row's event time plus the watermark delay, once the
  watermark reaches that (expiry <= watermark, as Spark 4). Rows older than the watermark for
  late events are dropped as late.

Per chunk, vectorised: the chunk's first row per key (Arrow's hash-based
``dictionary_encode``), one state lookup for those keys, the unseen
ones emitted and stored (one ``take``; none when every row is new). The state evicts by an
event-time index of sorted runs (see :mod:`headrace.state.orderindex`), so a batch costs
its rows, whatever the state's size. Rows are emitted as they are processed,
so a real-time batch emits per chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError, UnsupportedError
from headrace.options import Duration
from headrace.state.keyindex import FixedKeyIndex, fixed_width_keys
from headrace.transforms.operator import BatchInfo, OperatorContext
from headrace.transforms.stateful import StatefulOperator, drop_late_rows
from headrace.transforms.window import check_event_time, event_time_micros, exact_seconds

__all__ = ["DropDuplicatesOperator"]


class DropDuplicatesOperator(StatefulOperator):
    """``columns``: the key columns (empty: all columns). ``within_watermark``: Spark 3.5's
    ``dropDuplicatesWithinWatermark``. ``watermark_column``: the stream's ``with_watermark``
    column. ``watermark_delay``: its delay (``"10 minutes"``, seconds or a timedelta), needed
    by ``within_watermark``; the engine passes it as the context option ``watermarkDelayMs``
    (the preceding ``with_watermark``'s), used when this argument is not given."""

    operator_name: ClassVar[str] = "dedupe"
    supports_real_time: ClassVar[bool] = True
    output_modes: ClassVar[tuple[str, ...] | None] = ("append", "update")

    def __init__(
        self,
        columns: Sequence[str] = (),
        *,
        within_watermark: bool = False,
        watermark_column: str | None = None,
        watermark_delay: Any = None,
    ) -> None:
        super().__init__()
        if isinstance(columns, str):
            columns = [columns]
        self.columns = list(columns)
        self.within_watermark = within_watermark
        self.watermark_column = watermark_column
        self.delay_us: int | None = None
        if watermark_delay is not None:
            self.delay_us = round(Duration().parse(watermark_delay) * 1_000_000)
        if within_watermark and watermark_column is None:
            raise UnsupportedError(
                "drop_duplicates_within_watermark needs a watermark: call with_watermark(<event time column>, <delay>) "
                "first, or use drop_duplicates(...)"
            )
        self._keys: list[str] = []
        self._event_key = False

    @property
    def name(self) -> str:
        """Spark's operator names: ``dedupe``, ``dedupeWithinWatermark``."""
        return "dedupeWithinWatermark" if self.within_watermark else "dedupe"

    def describe(self) -> str:
        kind = "drop_duplicates_within_watermark" if self.within_watermark else "drop_duplicates"
        return f"{kind}({', '.join(self._keys or self.columns)})"

    def state_spec(self) -> dict[str, Any]:
        """The deduplication's state description: which kind, its key columns, the event-time
        column keys expire by (the watermark's, when it is a key or for
        ``drop_duplicates_within_watermark``; else none: keys are kept forever) and, within the
        watermark, the delay (each key's expiry in state is its first event time plus the
        delay). The output mode is not recorded: append and update are the same here."""
        event_time = self.watermark_column if self._event_key or self.within_watermark else None
        spec: dict[str, Any] = {
            "operator": "drop_duplicates_within_watermark" if self.within_watermark else "drop_duplicates",
            "columns": list(self._keys),
            "eventTime": event_time,
        }
        if self.within_watermark:
            spec["watermarkDelay"] = exact_seconds(self.delay_us) if self.delay_us is not None else None
        return spec

    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """The input schema (rows pass unchanged); validates the key columns. Called at
        ``start()``."""
        keys = self.columns or list(input_schema.names)
        missing = [c for c in keys if c not in input_schema.names]
        if missing:
            raise HeadraceError(
                f"{'drop_duplicates_within_watermark' if self.within_watermark else 'drop_duplicates'}: no column "
                f"{', '.join(map(repr, missing))} in the stream (columns: {', '.join(input_schema.names)})"
            )
        if len(set(keys)) != len(keys):
            raise HeadraceError(f"drop_duplicates: key columns repeat: {keys}")
        self._keys = keys
        if self.watermark_column is not None:
            check_event_time(input_schema, self.watermark_column, self.describe())
            self._event_key = self.watermark_column in keys
        self._input_schema = input_schema
        return input_schema

    def _state_schemas(self) -> tuple[pa.Schema, pa.Schema]:
        assert self._input_schema is not None
        return pa.schema([self._input_schema.field(k) for k in self._keys]), pa.schema([])

    def check_output_mode(self, mode: str) -> None:
        """``append`` and ``update`` (the same for deduplication); ``complete`` is refused as in
        Spark (there is no aggregation whose whole result could be emitted)."""
        super().check_output_mode(mode)
        if mode == "complete":
            raise UnsupportedError(
                "Complete output mode not supported when there are no streaming aggregations on streaming "
                f"DataFrames/Datasets: {self.describe()} emits each row once; use output mode 'append'"
            )

    def open(self, context: OperatorContext) -> None:
        if self.within_watermark and self.delay_us is None:
            delay = (context.options or {}).get("watermarkDelayMs")
            if delay is None:
                raise HeadraceError(
                    f"{self.describe()} needs the watermark delay: pass watermark_delay= to the operator or the "
                    "context option watermarkDelayMs"
                )
            self.delay_us = int(delay) * 1000
        super().open(context)

    # ------------------------------------------------------------------ per batch
    def _late_us(self, batch: BatchInfo) -> int | None:
        """The watermark (µs) input rows are dropped by as late: the previous batch's."""
        if batch.late_ms is None or self.watermark_column is None:
            return None
        return int(batch.late_ms) * 1000

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        """Emit the rows of this chunk whose key was never seen (nor earlier in the chunk)."""
        if not table.num_rows:
            return None
        wm_us = self._late_us(batch)
        ts: np.ndarray | None = None
        if self.watermark_column is not None and (self._event_key or self.within_watermark):
            ts, valid = event_time_micros(table.column(self.watermark_column))
            if valid is not None:  # a NULL event time is never late (Spark's predicate is NULL); as in
                # Spark, drop_duplicates keeps its key forever, the within-watermark one lets it expire soon
                ts = np.where(valid, ts, _NULL_EXPIRED if self.within_watermark else _NULL_KEPT)
            table, ts, late = drop_late_rows(table, ts, wm_us, valid=valid)
            if late is not None:
                self._dropped += int(late.sum())
            if not table.num_rows:
                return None
        # the first row of each key in the chunk, then those whose key is not in state: one take
        first = _first_rows(table.select(self._keys))
        keys = table.select(self._keys) if first is None else table.select(self._keys).take(pa.array(first))
        _, found = self.store.get(keys)
        if found.all():
            return None
        if first is None and not found.any():  # every row is new (the common case): no copy
            pos = None
        else:
            new = np.flatnonzero(~found)
            pos = new if first is None else first[new]
            table, keys = table.take(pa.array(pos)), keys.take(pa.array(new))
            if ts is not None:
                ts = ts[pos]
        order = None
        if ts is not None:
            order = ts + self.delay_us if self.within_watermark and self.delay_us is not None else ts
        self.store.put(keys, _no_values(keys.num_rows), order, absent=True)  # looked up just above
        return table

    def needs_batch_at(self, watermark_ms: int) -> bool:
        """Only when a key in state would be evicted at this watermark."""
        upto = self._eviction_us(watermark_ms)
        earliest = self.store.earliest_order() if upto is not None else None
        return earliest is not None and upto is not None and earliest <= upto

    def finish(self, batch: BatchInfo) -> pa.Table | None:
        """Evict keys the watermark passed, then commit state version ``batch_id``."""
        upto = self._eviction_us(batch.watermark_ms)
        if upto is not None:
            self.store.evict(upto)
        self._commit(batch)
        return None

    def _eviction_us(self, watermark_ms: int | None) -> int | None:
        """The order (µs) up to which keys are evicted at this watermark; None: none are.
        Spark evicts a key when its event time is <= the watermark; a within-watermark key
        when its expiry (first event time + delay) is <= the watermark (Spark 4's
        ``watermarkForEviction >= expiresAt``)."""
        if watermark_ms is None or self.watermark_column is None or not (self._event_key or self.within_watermark):
            return None
        return int(watermark_ms) * 1000


# the event times a NULL one is stored as: never evicted (drop_duplicates), or the epoch (within
# the watermark: Spark's stored expiry for it, evicted by the first watermark past the delay)
_NULL_KEPT = np.iinfo(np.int64).max
_NULL_EXPIRED = 0


def _first_rows(keys: pa.Table) -> np.ndarray | None:
    """The positions (ascending) of the first row of each key in ``keys``; None when every
    row's key differs. NULLs are equal to each other (as Arrow's ``group_by`` groups them).

    Hash-based, O(rows). Keys of integer, temporal and boolean columns: one numpy hash table
    (:func:`_first_rows_hashed`). Others: Arrow's ``dictionary_encode`` numbers a column's values in order of
    first appearance, so a row is its key's first exactly when its code exceeds every code
    before it. Several key columns are folded into one code column by column (the pair of
    codes so far and the next column's code, encoded again). Types Arrow cannot
    dictionary-encode fall back to ``group_by``."""
    n = keys.num_rows
    if n <= 1:
        return None
    if fixed_width_keys(keys.schema):
        return _first_rows_hashed(FixedKeyIndex(keys.num_columns).prepare(keys))
    try:
        codes: np.ndarray | None = None
        for c in keys.columns:
            enc = pc.dictionary_encode(c, null_encoding="encode")
            enc = enc.combine_chunks() if isinstance(enc, pa.ChunkedArray) else enc
            idx = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            if codes is None:
                codes = idx
            else:
                folded = pc.dictionary_encode(pa.array(codes * len(enc.dictionary) + idx))
                codes = folded.indices.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    except pa.ArrowNotImplementedError:
        pos = pa.array(np.arange(n, dtype=np.int64))
        first = keys.append_column("__i", pos).group_by(keys.column_names, use_threads=False).aggregate([("__i", "min")])
        return None if first.num_rows == n else np.sort(first.column("__i_min").to_numpy())
    assert codes is not None
    if int(codes[-1]) == n - 1:  # n distinct codes: every key differs
        return None
    head = np.empty(n, np.bool_)
    head[0] = True
    np.greater(codes[1:], np.maximum.accumulate(codes)[:-1], out=head[1:])
    return np.flatnonzero(head)


def _first_rows_hashed(prepared: Any) -> np.ndarray | None:
    """:func:`_first_rows` for keys of fixed-width columns, prepared as the memory backend's
    key index does (per row: the int64 values, the null bits and a 64-bit hash of them).

    An open-addressing table (linear probing, load <= 1/4) filled by whole-array rounds: the
    rows still unplaced claim the empty bucket they aim at (``np.minimum.at``: the lowest row
    wins), then every row whose key equals its bucket's owner's is placed (the owner is the
    key's first row: rows of one key share their probe sequence, so they reach a bucket
    together) and the others probe the next bucket. Keys are compared in full, so a hash
    collision costs a probe, never a wrong answer. ~3x faster than ``dictionary_encode`` per
    column and folding the codes (100k rows, one or two int64 columns)."""
    vals: np.ndarray = prepared.vals
    n = len(vals)
    cap = 1 << max(4, (4 * n - 1).bit_length())
    mask = cap - 1
    owner = np.full(cap, n, np.int64)  # bucket -> the row that owns it; n: empty
    pos = (prepared.h & np.uint64(mask)).astype(np.int64)
    rows = np.arange(n, dtype=np.int64)
    first = np.zeros(n, np.bool_)
    columns = [vals[:, j] for j in range(vals.shape[1])]
    everywhere = True  # the first round: every bucket is empty
    while len(rows):
        if everywhere:
            np.minimum.at(owner, pos, rows)
            everywhere = False
        else:
            free = owner[pos] == n
            np.minimum.at(owner, pos[free], rows[free])
        own = owner[pos]
        won = own == rows
        first[rows[won]] = True
        lost = np.flatnonzero(~won)  # a later row of the owner's key, or another key's row
        mine, theirs = rows[lost], own[lost]
        same = columns[0][mine] == columns[0][theirs]
        for c in columns[1:]:
            same &= c[mine] == c[theirs]
        move = lost[~same]
        rows = rows[move]
        pos = (pos[move] + 1) & mask
    return None if first.all() else np.flatnonzero(first)


def _no_values(n: int) -> pa.Table:
    return pa.table({"_": pa.nulls(n)}).drop_columns(["_"])

"""``transform_with_state``: Spark 4's arbitrary stateful processing (``transformWithState`` /
``transformWithStateInPandas``) on a grouped stream.

A :class:`StatefulProcessor` declares state variables (value, list, map; each with an optional
TTL) on a handle in ``init``, is called per grouping key with that key's rows of the batch
(``handle_input_rows``), per fired timer (``handle_expired_timer``) and, in the first batch,
per key of an initial state (``handle_initial_state``), and yields output rows.

Per micro-batch, in ``finish`` (on the engine's consumer thread):

1. first batch only: the initial state's keys, ``handle_initial_state`` per key;
2. the batch's rows grouped by key (one Arrow ``group_by`` and one ``take``),
   ``handle_input_rows`` per key with a slice of the sorted rows (a ``pyarrow.Table``); a
   state variable's first read fetches the state of all those keys in one ``get`` per store;
3. the changed state written back, then the timers that expired (processing time: earlier
   than the batch's timestamp; event time: earlier than the batch's watermark) taken from
   the timer store's ordered index, in time order, ``handle_expired_timer`` for each;
4. values whose TTL expired removed, each store committed as version ``batch_id``.

The cost grows with the keys touched and the timers fired, not with the state's size.

In real-time mode ``handle_input_rows`` is called once per row as rows arrive (its output is
emitted at once), event-time timers are refused, and processing-time timers fire in
``finish``, when the long-running batch ends.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError, UnsupportedError
from headrace.state.columns import to_int64
from headrace.transforms.operator import BatchInfo, OperatorContext, StateWrite
from headrace.transforms.state_variables import (
    ExpiredTimerInfo,
    KeyBatch,
    KeySet,
    ListState,
    MapState,
    StatefulProcessorHandle,
    TimerValues,
    ValueState,
    parse_state_schema,
)
from headrace.transforms.stateful import StatefulOperator
from headrace.transforms.window import event_time_micros

__all__ = [
    "TIME_MODES",
    "ExpiredTimerInfo",
    "KeyBatch",
    "ListState",
    "MapState",
    "StatefulProcessor",
    "StatefulProcessorHandle",
    "TimerValues",
    "TransformWithStateOperator",
    "ValueState",
]

log = logging.getLogger(__name__)

TIME_MODES = ("none", "processing_time", "event_time")
_TIME_MODE_NAMES = {"none": "none", "notime": "none", "processing_time": "processing_time",
                    "processingtime": "processing_time", "event_time": "event_time",
                    "eventtime": "event_time"}  # fmt: skip


class StatefulProcessor:
    """Arbitrary stateful logic per grouping key (Spark 4's ``StatefulProcessor``). Subclass it
    and implement :meth:`init` and :meth:`handle_input_rows`; the others are optional.

    All methods are called on the engine's consumer thread, one at a time. ``self.handle``
    is the :class:`StatefulProcessorHandle`, set before :meth:`init`.

    Output: the methods that emit yield (or return an iterable of) ``pyarrow.Table`` or
    ``RecordBatch`` objects, pandas DataFrames, or single rows as dicts (by column name) or
    tuples (by position), each in the ``output_schema`` of ``transform_with_state``.
    """

    handle: StatefulProcessorHandle

    def init(self, handle: StatefulProcessorHandle) -> None:
        """Declare the state variables (``handle.get_value_state(...)``, ...). Called once per
        query run, before its first batch."""
        raise NotImplementedError(f"{type(self).__name__} must define init(self, handle)")

    def handle_input_rows(
        self, key: tuple[Any, ...], rows: pa.Table, timer_values: TimerValues
    ) -> Iterable[Any]:
        """Called once per batch for each grouping key with rows in it (``key``: the tuple of
        the grouping columns' values; ``rows``: that key's rows, all input columns), in
        real-time mode once per row. Yields the output rows."""
        raise NotImplementedError(
            f"{type(self).__name__} must define handle_input_rows(self, key, rows, timer_values)"
        )

    def handle_input_batch(self, batch: KeyBatch, timer_values: TimerValues) -> Iterable[Any]:
        """Opt-in, instead of :meth:`handle_input_rows`: called once per batch with every key
        that has rows (``batch.keys``; ``batch.rows`` sorted by key, ``batch.offsets``). It
        does, for all keys at once, what ``handle_input_rows`` does per key: value state
        through ``get_batch``/``exists_batch``/``update_batch``/``clear_batch``, timers
        through ``handle.register_timer_batch``/``delete_timer_batch``, one value (row) per
        key. Yields output tables or rows. In real-time mode it is called once per row."""
        raise NotImplementedError

    def handle_expired_timer_batch(
        self, batch: KeyBatch, timer_values: TimerValues, expiry_time_ms: np.ndarray
    ) -> Iterable[Any]:
        """Opt-in, instead of :meth:`handle_expired_timer`: called with keys whose timers
        fired (``batch.keys``, no rows) and ``expiry_time_ms``, the fired timer of each key
        (int64 array). A key with several fired timers is in several calls, one per timer,
        in time order; each timer is deleted after its call. Yields output rows."""
        raise NotImplementedError

    def handle_expired_timer(self, key: tuple[Any, ...], timer_values: TimerValues,
                             expired_timer_info: ExpiredTimerInfo) -> Iterable[Any]:  # fmt: skip
        """Called once per fired timer, after the batch's rows were handled, timers in time
        order; the timer is deleted after the call. Yields output rows (none by default)."""
        return ()

    def handle_initial_state(
        self, key: tuple[Any, ...], initial_state: pa.Table, timer_values: TimerValues
    ) -> None:
        """Called in the query's first batch, once per key of the ``initial_state`` frame (all
        its rows for that key), before any ``handle_input_rows``."""

    def close(self) -> None:
        """Called once when the query stops."""


def _overrides(processor: StatefulProcessor, method: str) -> bool:
    return getattr(type(processor), method) is not getattr(StatefulProcessor, method)


def parse_time_mode(value: Any) -> str:
    """``none`` / ``processing_time`` / ``event_time`` (also Spark's ``NoTime``,
    ``ProcessingTime``, ``EventTime``, in any case)."""
    mode = (
        _TIME_MODE_NAMES.get(str(value).strip().lower().replace(" ", "")) if isinstance(value, str) else None
    )
    if mode is None:
        raise HeadraceError(
            f"transform_with_state: time_mode {value!r} is not one of {', '.join(TIME_MODES)}"
        )
    return mode


class _Writes:
    """The state writes of several stores, waited for in turn."""

    def __init__(self, writes: list[StateWrite]) -> None:
        self._writes = writes

    def result(self, timeout: float | None = None) -> Any:
        for w in self._writes:
            w.result(timeout)
        return None


class TransformWithStateOperator(StatefulOperator):
    """``keys``: the grouping columns. ``processor``: a :class:`StatefulProcessor`.
    ``output_schema``: DDL string or ``pyarrow.Schema`` of the rows it emits. ``output_mode``:
    ``append`` or ``update`` (Spark's argument; ``complete`` is refused). ``time_mode``:
    ``none`` / ``processing_time`` / ``event_time`` (needs ``with_watermark``).
    ``initial_state``: a static frame or ``pyarrow.Table`` holding the grouping columns."""

    operator_name: ClassVar[str] = "transformWithState"
    supports_real_time: ClassVar[bool] = True
    output_modes: ClassVar[tuple[str, ...] | None] = ("append", "update")

    def __init__(
        self,
        keys: list[str],
        processor: StatefulProcessor,
        output_schema: Any,
        output_mode: str = "append",
        time_mode: str = "none",
        *,
        initial_state: Any = None,
        watermark_column: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(processor, StatefulProcessor):
            raise HeadraceError(f"transform_with_state takes a headrace.StatefulProcessor, not "
                                f"{type(processor).__name__}; subclass hr.StatefulProcessor")  # fmt: skip
        if not keys or not all(isinstance(k, str) for k in keys):
            raise HeadraceError(
                f"transform_with_state needs group_by(<column names>) first, not keys {keys!r}"
            )
        self.keys = list(keys)
        self.processor = processor
        self._batched_input = _overrides(processor, "handle_input_batch")
        self._batched_timers = _overrides(processor, "handle_expired_timer_batch")
        self.out_schema = parse_state_schema(output_schema, "transform_with_state output_schema")
        mode = str(output_mode).strip().lower()
        if mode not in ("append", "update"):
            raise UnsupportedError(f"transform_with_state: output_mode {output_mode!r} is not supported; use 'append' "
                                   "or 'update' (Spark's transformWithState supports no other)")  # fmt: skip
        self.tws_output_mode = mode
        self.time_mode = parse_time_mode(time_mode)
        self.watermark_column = watermark_column
        if self.time_mode == "event_time" and watermark_column is None:
            raise UnsupportedError("transform_with_state(time_mode='event_time') needs a watermark: call "
                                   "with_watermark(<event time column>, <delay>) before group_by")  # fmt: skip
        self.initial_state = initial_state
        if initial_state is not None:
            from headrace.transforms.join import StaticTable

            if not isinstance(initial_state, StaticTable | pa.Table):
                raise HeadraceError(
                    "transform_with_state: initial_state must be a static frame (hr.read...load(), "
                    f"StaticFrame.from_arrow) or a pyarrow.Table, not {type(initial_state).__name__}"
                )
        self._handle: StatefulProcessorHandle | None = None
        self._chunks: list[pa.Table] = []
        self._tv = TimerValues()
        self._first_batch_of_run = True
        self._pending_initial = False
        self._extra_metrics: dict[str, int] = {}

    def describe(self) -> str:
        return f"transform_with_state({type(self.processor).__name__}, keys=[{', '.join(self.keys)}])"

    # ------------------------------------------------------------------ definition
    def output_schema(self, input_schema: pa.Schema) -> pa.Schema:
        """The processor's ``output_schema``; validates the grouping columns. Called at start."""
        missing = [k for k in self.keys if k not in input_schema.names]
        if missing:
            raise HeadraceError(f"transform_with_state: no grouping column {', '.join(map(repr, missing))} in the "
                                f"stream (columns: {', '.join(input_schema.names)})")  # fmt: skip
        self._input_schema = input_schema
        return self.out_schema

    def _key_schema(self) -> pa.Schema:
        assert self._input_schema is not None
        return pa.schema([self._input_schema.field(k) for k in self.keys])

    def _state_schemas(self) -> tuple[pa.Schema, pa.Schema]:
        assert self._handle is not None
        return self._key_schema(), self._handle._timers.value_schema()

    def state_spec(self) -> dict[str, Any]:
        """The grouping columns, the time mode and the declared state variables (name, kind,
        schema) in declaration order. Not recorded (may change): TTLs, the output schema and
        mode, the processor's class."""
        assert self._handle is not None
        return {"operator": "transform_with_state", "keys": list(self.keys), "timeMode": self.time_mode,
                "variables": [v.spec() for v in self._handle._variables.values()]}  # fmt: skip

    def check_output_mode(self, mode: str) -> None:
        """``append`` and ``update``; ``complete`` is refused as in Spark."""
        super().check_output_mode(mode)
        if mode == "complete":
            raise UnsupportedError("Complete output mode not supported when there are no streaming aggregations on "
                                   f"streaming DataFrames/Datasets: {self.describe()}; use output mode 'append' or "
                                   "'update'")  # fmt: skip

    # ------------------------------------------------------------------ life cycle
    def open(self, context: OperatorContext) -> None:
        """Call the processor's ``init`` (declaring its variables), open the timer store in
        the operator's folder and one store per variable in ``vars/<name>``."""
        from headrace.state import open_state_store

        if self._input_schema is None:
            raise HeadraceError(
                f"{self.describe()}: output_schema(input_schema) must be called before open()"
            )
        if context.real_time and self.time_mode == "event_time":
            raise UnsupportedError(
                f"{self.describe()}: event-time timers are not supported in real-time mode (as in "
                "the reference); use time_mode='processing_time' or a micro-batch trigger"
            )
        handle = StatefulProcessorHandle(self.time_mode, self._key_schema())
        handle.real_time = context.real_time
        self._handle = handle
        self.processor.handle = handle
        self.processor.init(handle)
        handle._declaring = False
        super().open(context)
        handle._timers.store = self._store
        assert context.state_path is not None
        opts = context.options or {}
        for var in handle._variables.values():
            path = os.path.join(context.state_path, "vars", var.name)
            var.store = open_state_store(
                context.state_backend,
                path,
                self._key_schema(),
                var.value_schema(),
                retain=context.retain,
                snapshot_interval=int(opts.get("stateSnapshotInterval", 10)),
                durable=bool(opts.get("checkpointFsync", True)),
                description=f"{self.describe()} {var.spec()}",
                operator_spec={"operator": "transform_with_state variable", "variable": var.spec()},
                query_id=context.query_id,
                operator_id=f"{context.index}:{self.operator_name}:{var.name}",
            )
        self._first_batch_of_run = True

    def _stores(self) -> list[Any]:
        assert self._handle is not None
        return [v.store for v in self._handle._all() if v.store is not None]

    def begin(self, batch: BatchInfo) -> None:
        """Load version ``batch_id - 1`` of every store; the batch's timer values."""
        super().begin(batch)
        handle = self.handle_
        for var in handle._variables.values():
            assert var.store is not None
            var.store.load(batch.batch_id - 1)
        handle._key, handle._keyset, handle._pos = None, None, -1
        for v in handle._all():
            v.reset()
        if self._first_batch_of_run:
            for name in handle._purge:
                handle._variables[name].purge()
            self._first_batch_of_run = False
        self._tv = self._timer_values(batch)
        handle._timer_values = self._tv
        self._chunks = []
        self._extra_metrics = {"numInputRowsHandled": 0, "numTimersFired": 0, "numInitialStateKeys": 0}
        if batch.batch_id == 0 and self.initial_state is not None:
            self._pending_initial = True
        else:
            self._pending_initial = False

    @property
    def handle_(self) -> StatefulProcessorHandle:
        if self._handle is None:
            raise HeadraceError(
                f"{self.describe()} is not open (the engine calls open() before the first batch)"
            )
        return self._handle

    def _timer_values(self, batch: BatchInfo) -> TimerValues:
        ts = getattr(batch, "timestamp_ms", None)
        now = int(ts) if ts is not None else int(time.time() * 1000)
        wm = batch.watermark_ms if self.time_mode == "event_time" and batch.watermark_ms is not None else -1
        return TimerValues(now if self.time_mode != "none" else -1, int(wm))

    def process(self, table: pa.Table, batch: BatchInfo) -> pa.Table | None:
        """Micro-batch: keep the chunk for ``finish``. Real-time: ``handle_input_rows`` per row
        now, returning what it emits."""
        table = self._drop_late(table, batch)
        if not table.num_rows:
            return None
        if not batch.real_time:
            self._chunks.append(table)
            return None
        out = _Output(self)
        if self._pending_initial:
            self._run_initial_state(out)
        handle = self.handle_
        if self._batched_input:
            self._settle_caches()
            key_table = table.select(self.keys)
            for i in range(table.num_rows):
                keyed = KeyBatch(key_table.slice(i, 1), table.slice(i, 1), np.array([0, 1], np.int64))
                self._call_batch(out, keyed, "handle_input_batch", self._tv)
            self._extra_metrics["numInputRowsHandled"] += table.num_rows
            return out.table()
        key_table = table.select(self.keys)
        keys = handle._keys_of(key_table)
        index: dict[tuple[Any, ...], int] = {}
        first: list[int] = []  # a key set holds each key once: the position of each key's first row
        for i, key in enumerate(keys):
            if key not in index:
                index[key] = len(first)
                first.append(i)
        handle._begin(KeySet([keys[i] for i in first], key_table.take(pa.array(first, pa.int64()))))
        try:
            for i, key in enumerate(keys):
                handle._key, handle._pos = key, index[key]
                out.add(
                    self.processor.handle_input_rows(key, table.slice(i, 1), self._tv), "handle_input_rows"
                )
        except BaseException:
            handle._abandon()
            raise
        handle._end()
        self._extra_metrics["numInputRowsHandled"] += table.num_rows
        return out.table()

    def _drop_late(self, table: pa.Table, batch: BatchInfo) -> pa.Table:
        """Event time: drop the rows whose event time the watermark for late events (the
        previous batch's) has passed (``<=``), as Spark's ``TransformWithStateExec`` does; a
        NULL event time is kept."""
        if self.time_mode != "event_time" or batch.late_ms is None or self.watermark_column is None:
            return table
        if not table.num_rows or self.watermark_column not in table.column_names:
            return table
        ts, valid = event_time_micros(table.column(self.watermark_column))
        late = ts <= int(batch.late_ms) * 1000
        if valid is not None:
            late &= valid
        n = int(late.sum())
        if not n:
            return table
        self._dropped += n
        return table.filter(pa.array(~late))

    def _settle_caches(self) -> None:
        """Write back and forget what per-key calls held, so that batched calls (which
        read and write the stores directly) see it, and later per-key calls see theirs."""
        self.handle_._end()

    def _call_batch(self, out: _Output, batch: KeyBatch, method: str, *args: Any) -> None:
        handle = self.handle_
        handle._batch = batch
        try:
            out.add(getattr(self.processor, method)(batch, *args), method)
        finally:
            handle._batch = None

    def _per_key(self, out: _Output, method: str, groups: _Groups, *args: Any) -> None:
        """``method`` (``handle_input_rows`` or ``handle_initial_state``) once per key of
        ``groups`` with its rows, in key order; the variables hold the entries of these keys
        by position (a variable's first read reads all of them in one ``get``; one never read
        costs nothing) and write back what changed when the run ends."""
        handle = self.handle_
        keys = handle._keys_of(groups.keys)
        call = getattr(self.processor, method)
        add = out.add
        emits = method != "handle_initial_state"  # which returns nothing (Spark's handleInitialState)
        rows = groups._rows
        offsets = groups._offsets.tolist()
        handle._begin(KeySet(keys, groups.keys))
        try:
            for pos, key in enumerate(keys):
                handle._key = key
                handle._pos = pos
                lo = offsets[pos]
                result = call(key, rows.slice(lo, offsets[pos + 1] - lo), *args)
                if result is not None and emits:
                    add(result, method)
        except BaseException:
            handle._abandon()
            raise
        handle._end()

    def _run_initial_state(self, out: _Output) -> None:
        from headrace.transforms.join import StaticTable

        self._pending_initial = False
        init = (
            self.initial_state.to_arrow()
            if isinstance(self.initial_state, StaticTable) and not isinstance(self.initial_state, pa.Table)
            else self.initial_state
        )
        missing = [k for k in self.keys if k not in init.column_names]
        if missing:
            raise HeadraceError(f"transform_with_state: the initial_state has no grouping column "
                                f"{', '.join(map(repr, missing))} (columns: {', '.join(init.column_names)})")  # fmt: skip
        if not init.num_rows:
            return
        ks = self._key_schema()
        try:
            key_cols = pa.Table.from_arrays(
                [init.column(k).cast(ks.field(k).type) for k in self.keys], schema=ks
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise HeadraceError(f"transform_with_state: the initial_state's grouping columns do not have the "
                                f"stream's types ({ks}): {e}") from None  # fmt: skip
        groups = _group(key_cols, init)
        self._per_key(out, "handle_initial_state", groups, self._tv)
        self._extra_metrics["numInitialStateKeys"] += groups.keys.num_rows

    def finish(self, batch: BatchInfo) -> pa.Table | None:
        """Handle the batch's rows per key, fire the expired timers, expire TTLs, commit."""
        handle = self.handle_
        out = _Output(self)
        if self._pending_initial:
            self._run_initial_state(out)
        chunks, self._chunks = self._chunks, []
        if chunks:
            table = pa.concat_tables(chunks) if len(chunks) > 1 else chunks[0]
            groups = _group(table.select(self.keys), table)
            if self._batched_input:
                self._settle_caches()
                keyed = KeyBatch(groups.keys, groups._rows, groups._offsets)
                self._call_batch(out, keyed, "handle_input_batch", self._tv)
            else:
                self._per_key(out, "handle_input_rows", groups, self._tv)
            self._extra_metrics["numInputRowsHandled"] += table.num_rows
        handle._end()
        self._fire_timers(batch, out)
        now = self._tv.current_processing_time_ms
        if self.time_mode != "none":
            for var in handle._variables.values():
                var.expire(now)
        self._commit_all(batch)
        return out.table()

    def _fire_timers(self, batch: BatchInfo, out: _Output) -> None:
        handle = self.handle_
        if self.time_mode == "none":
            return
        if self.time_mode == "event_time":
            if batch.watermark_ms is None:
                return
            before = int(batch.watermark_ms)
        elif batch.real_time:  # processing-time timers fire when the long-running batch ends
            before = max(self._tv.current_processing_time_ms, int(time.time() * 1000))
            self._tv = TimerValues(before, self._tv.current_watermark_ms)
            handle._timer_values = self._tv
        else:
            before = self._tv.current_processing_time_ms
        if self._batched_timers:
            self._fire_timers_batched(before, out)
            return
        timers = handle._timers
        keyset, fired = timers.expired(before)
        if not fired:
            handle._end()  # the evicted rows written back
            return
        keys = keyset.keys
        assert keys is not None
        call = self.processor.handle_expired_timer
        handle._begin(keyset)
        n = 0
        try:
            for ts, pos in fired:
                if ts not in timers._vals[pos]:
                    continue  # deleted by an earlier handler of the same key
                key = keys[pos]
                handle._key = key
                handle._pos = pos
                result = call(key, self._tv, ExpiredTimerInfo(ts))
                if result is not None:
                    out.add(result, "handle_expired_timer")
                timers.delete(ts)
                n += 1
        except BaseException:
            handle._abandon()
            raise
        self._extra_metrics["numTimersFired"] += n
        handle._end()

    def _fire_timers_batched(self, before: int, out: _Output) -> None:
        """The timers earlier than ``before``, by rounds: round ``r`` calls
        ``handle_expired_timer_batch`` with the keys that have an ``r``-th fired timer (time
        order within the round), each timer deleted after its call; a timer deleted by an
        earlier round's call does not fire. Per key, the calls are in time order, as one call
        per timer would be."""
        self._settle_caches()
        timers = self.handle_._timers
        store = timers.store
        assert store is not None
        earliest = store.earliest_order()
        if earliest is None or earliest >= before:
            return
        due = store.evict(before - 1)
        if not due.num_rows:
            return
        keys = due.select(self.keys)
        # back into the store: each timer is deleted after its call, as handle_expired_timer's
        store.put(keys, due.select(timers.value_schema().names), due.column("__order"))
        parent, times = timers.flatten(due)
        starts = np.zeros(due.num_rows, np.int64)  # the position of each key's first timer
        np.cumsum(np.bincount(parent, minlength=due.num_rows)[:-1], out=starts[1:])
        rank = np.arange(len(times), dtype=np.int64) - starts[parent]
        fired = times < before
        if not fired.any():
            return
        for r in range(int(rank[fired].max()) + 1):
            sel = np.flatnonzero(fired & (rank == r))
            sel = sel[np.argsort(times[sel], kind="stable")]
            kt, ts = keys.take(pa.array(parent[sel])), times[sel]
            if r:  # still registered (an earlier call may have deleted it)
                have = timers.lists_batch(kt)
                p = pc.list_parent_indices(have).to_numpy(zero_copy_only=False)
                t = pc.list_flatten(have).to_numpy(zero_copy_only=False)
                live = np.bincount(p[t == ts[p]], minlength=len(ts)) > 0
                if not live.all():
                    idx = np.flatnonzero(live)
                    kt, ts = kt.take(pa.array(idx)), ts[idx]
            if not len(ts):
                continue
            self._call_batch(out, KeyBatch(kt), "handle_expired_timer_batch", self._tv, ts)
            timers.change_batch(kt, ts, add=False)
            self._extra_metrics["numTimersFired"] += len(ts)

    def _commit_all(self, batch: BatchInfo) -> None:
        handle = self.handle_
        for var in handle._variables.values():
            assert var.store is not None
            var.store.commit(batch.batch_id, wait=False)
        self._commit(batch)
        totals = {"numRowsTotal": 0, "numRowsUpdated": 0, "numRowsRemoved": 0, "memoryUsedBytes": 0}
        for store in self._stores():
            for k, v in store.metrics().items():
                if k in totals and isinstance(v, int | float):
                    totals[k] += int(v)
        self._metrics.update(totals)
        self._metrics.update(self._extra_metrics)
        self._metrics["numRegisteredTimers"] = len(self.store)

    def state_write(self) -> StateWrite | None:
        """Every store's pending write of the version the last ``finish`` committed."""
        writes = [w for w in (s.pending_write() for s in self._stores()) if w is not None]
        return _Writes(writes) if writes else None

    def needs_batch_at(self, watermark_ms: int) -> bool:
        """Event time: when a timer is earlier than the new watermark."""
        if self.time_mode != "event_time" or self._store is None:
            return False
        earliest = self._store.earliest_order()
        return earliest is not None and earliest < watermark_ms

    def needs_batch_at_time(self, now_ms: int) -> bool:
        """Processing time: when a timer is earlier than ``now_ms``, or a TTL expired by then."""
        if self._handle is None or self.time_mode == "none":
            return False
        if self.time_mode == "processing_time" and self._store is not None:
            earliest = self._store.earliest_order()
            if earliest is not None and earliest < now_ms:
                return True
        for var in self._handle._variables.values():
            if var.ttl_ms is not None and var.store is not None:
                e = var.store.earliest_order()
                if e is not None and e <= now_ms:
                    return True
        return False

    def close(self) -> None:
        """Close the processor (once), then every store."""
        handle = self._handle
        if handle is not None:
            self._handle = None
            try:
                self.processor.close()
            finally:
                for var in handle._variables.values():
                    if var.store is not None:
                        var.store.close()
                        var.store = None
                super().close()
        else:
            super().close()


class _Groups:
    """A table's rows grouped by key: the distinct keys (first-seen order) and the rows sorted
    so that each key's rows are one slice."""

    def __init__(self, keys: pa.Table, rows: pa.Table, offsets: np.ndarray) -> None:
        self.keys = keys
        self._rows = rows
        self._offsets = offsets


def _group(key_cols: pa.Table, table: pa.Table) -> _Groups:
    if key_cols.num_columns == 1 and table.num_rows > 1:
        col = key_cols.column(0)
        if col.null_count == 0 and (pa.types.is_integer(col.type) or pa.types.is_temporal(col.type)):
            return _group_integers(key_cols, table)
    idx = pa.array(np.arange(table.num_rows, dtype=np.int64))
    g = key_cols.append_column("__i", idx).group_by(key_cols.column_names, use_threads=False)
    agg = g.aggregate([("__i", "list")])
    lists = agg.column("__i_list").combine_chunks()
    order = pc.list_flatten(lists)
    lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    keys = agg.select(key_cols.column_names)
    rows = table.take(order) if table.num_rows > 1 else table
    return _Groups(keys, rows, offsets)


def _group_integers(key_cols: pa.Table, table: pa.Table) -> _Groups:
    """:func:`_group` for one integer (or temporal) key column without nulls, in numpy: a
    stable sort and the runs of equal keys (keys in ascending order)."""
    col = key_cols.column(0).combine_chunks()
    ints = to_int64(col).to_numpy(zero_copy_only=False)
    order = np.argsort(ints, kind="stable")
    sorted_ints = ints[order]
    starts = np.flatnonzero(np.concatenate([[True], sorted_ints[1:] != sorted_ints[:-1]]))
    offsets = np.concatenate([starts, [len(sorted_ints)]]).astype(np.int64)
    idx = pa.array(order)
    keys = pa.Table.from_arrays([col.take(pa.array(order[starts]))], schema=key_cols.schema)
    return _Groups(keys, table.take(idx), offsets)


class _Output:
    """The rows a batch emits: tables kept as they are, single rows gathered as tuples (in the
    output schema's column order) and converted column by column once, all cast to the output
    schema at the end."""

    def __init__(self, op: TransformWithStateOperator) -> None:
        self._op = op
        self._schema = op.out_schema
        self._names = op.out_schema.names
        self._width = len(op.out_schema)
        self._tables: list[pa.Table] = []
        self._rows: list[tuple[Any, ...]] = []

    def add(self, result: Iterable[Any] | None, method: str) -> None:
        if result is None:
            return
        try:
            items = iter(result)
        except TypeError:
            raise HeadraceError(f"{type(self._op.processor).__name__}.{method} returned {type(result).__name__}; "
                                "it must yield (or return a list of) output tables or rows") from None  # fmt: skip
        rows = self._rows
        width = self._width
        for item in items:
            if type(item) is tuple and len(item) == width:  # the common case first
                rows.append(item)
            elif item is None:
                continue
            elif isinstance(item, pa.Table):
                self._flush_rows()
                self._tables.append(self._cast(item, method))
            elif isinstance(item, pa.RecordBatch):
                self._flush_rows()
                self._tables.append(self._cast(pa.Table.from_batches([item]), method))
            elif isinstance(item, dict):
                rows.append(tuple(item.get(n) for n in self._names))
            elif isinstance(item, tuple | list):
                if len(item) != width:
                    raise HeadraceError(f"{type(self._op.processor).__name__}.{method} yielded the row {item!r} of "
                                        f"{len(item)} values; the output schema has {width} columns "
                                        f"({', '.join(self._names)})")  # fmt: skip
                rows.append(tuple(item))
            elif type(item).__name__ == "DataFrame" and hasattr(item, "columns"):
                self._flush_rows()
                self._tables.append(self._cast(pa.Table.from_pandas(item, preserve_index=False), method))
            else:
                raise HeadraceError(f"{type(self._op.processor).__name__}.{method} yielded a "
                                    f"{type(item).__name__}; yield pyarrow tables, pandas DataFrames, or rows as dicts "
                                    "or tuples")  # fmt: skip

    def _flush_rows(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            try:
                arrays = [pa.array([r[i] for r in rows], f.type) for i, f in enumerate(self._schema)]
                self._tables.append(pa.Table.from_arrays(arrays, schema=self._schema))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                raise HeadraceError(f"{type(self._op.processor).__name__}: output rows do not fit the output schema "
                                    f"({self._schema}): {e}") from None  # fmt: skip

    def _cast(self, t: pa.Table, method: str) -> pa.Table:
        missing = [n for n in self._schema.names if n not in t.column_names]
        if missing:
            raise HeadraceError(f"{type(self._op.processor).__name__}.{method} yielded a table without the output "
                                f"column {', '.join(missing)} (it has {', '.join(t.column_names)})")  # fmt: skip
        try:
            return t.select(self._schema.names).cast(self._schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
            raise HeadraceError(f"{type(self._op.processor).__name__}.{method} yielded columns that do not cast to "
                                f"the output schema ({self._schema}): {e}") from None  # fmt: skip

    def table(self) -> pa.Table | None:
        self._flush_rows()
        if not self._tables:
            return None
        return pa.concat_tables(self._tables) if len(self._tables) > 1 else self._tables[0]

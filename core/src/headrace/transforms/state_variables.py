"""The state variables of ``transform_with_state`` (Spark 4's ``ValueState``, ``ListState``,
``MapState``), the timers, and the handle a :class:`StatefulProcessor` declares them on.

Each variable lives in its own state store (``<state>/vars/<name>/``, either backend), keyed by
the grouping key; the timers live in the operator's own store. The per-key calls of a batch
come in runs (the keys with rows, the keys whose timers fire), each over a :class:`KeySet`:
a variable's first read in a run fetches the rows of all its keys in one ``get`` (decoded
into one Python entry per key, held by position), the processor reads and changes the entry
of the key it is called for (the *implicit key*, as in Spark) at the handle's position, and
the changed entries are written back at the end of the run in one ``put`` and one ``remove``
per store, their keys taken from the key set's table (:meth:`_Variable.flush`). A row's ``order`` in its store is its earliest TTL expiry
(timers: the earliest timer), so expiry and firing walk the stores' ordered index and cost
what expires, not the state's size.

Stored rows (``value.<field>``, ``__items``, ``__entries``, ``__timer`` are columns of the
store):

- value state: ``value.<field>`` per field of the variable's schema (flat columns: no Python
  object per value in either backend), ``__expires`` (ms, or null);
- list state: ``__items``, a list of structs ``{value, expires}``;
- map state: ``__entries``, a list of structs ``{key, value, expires}``;
- timers: ``__timer``, the key's earliest timer (ms), and ``__later``, the others, sorted (null
  when none).

TTL is Spark's: an update sets the value's (element's, entry's) expiry to the batch's
processing time plus the TTL; an expired value is not returned, and is removed at the end of
the batch whose processing time reaches its expiry.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError, UnsupportedError

if TYPE_CHECKING:
    from headrace.state.store import StateStore

__all__ = [
    "ExpiredTimerInfo",
    "KeyBatch",
    "KeySet",
    "ListState",
    "MapState",
    "StatefulProcessorHandle",
    "TimerValues",
    "ValueState",
]

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


class TimerValues:
    """The times of the batch a processor method is called in: ``current_processing_time_ms``
    (the batch's timestamp, recorded in the checkpoint so a replay sees the same) and
    ``current_watermark_ms`` (the event-time watermark of the batch, in ``event_time`` mode);
    ``-1`` where the time mode has none (Spark's ``TimerValues``)."""

    __slots__ = ("current_processing_time_ms", "current_watermark_ms")

    def __init__(self, current_processing_time_ms: int = -1, current_watermark_ms: int = -1) -> None:
        self.current_processing_time_ms = int(current_processing_time_ms)
        self.current_watermark_ms = int(current_watermark_ms)

    def get_current_processing_time_in_ms(self) -> int:
        """PySpark's ``getCurrentProcessingTimeInMs``."""
        return self.current_processing_time_ms

    def get_current_watermark_in_ms(self) -> int:
        """PySpark's ``getCurrentWatermarkInMs``."""
        return self.current_watermark_ms

    getCurrentProcessingTimeInMs = get_current_processing_time_in_ms
    getCurrentWatermarkInMs = get_current_watermark_in_ms

    def __repr__(self) -> str:
        return f"TimerValues(processing={self.current_processing_time_ms}, watermark={self.current_watermark_ms})"


class ExpiredTimerInfo:
    """The timer ``handle_expired_timer`` is called for: ``expiry_time_ms``."""

    __slots__ = ("expiry_time_ms",)

    def __init__(self, expiry_time_ms: int) -> None:
        self.expiry_time_ms = int(expiry_time_ms)

    def get_expiry_time_in_ms(self) -> int:
        """PySpark's ``getExpiryTimeInMs``."""
        return self.expiry_time_ms

    getExpiryTimeInMs = get_expiry_time_in_ms

    def __repr__(self) -> str:
        return f"ExpiredTimerInfo({self.expiry_time_ms})"


class KeyBatch:
    """The grouping keys a batched processor method is called for at once
    (``handle_input_batch``, ``handle_expired_timer_batch``): ``keys``, a ``pyarrow.Table`` of
    the grouping columns with one row per key (each key once); for input, ``rows``, the
    batch's rows sorted so that key ``i``'s rows are ``rows[offsets[i]:offsets[i + 1]]``.
    The state variables' ``*_batch`` methods and the handle's ``*_timer_batch`` methods act
    on these keys, position ``i`` for ``keys[i]``. Built by the operator on its thread."""

    __slots__ = ("keys", "offsets", "rows")

    def __init__(
        self, keys: pa.Table, rows: pa.Table | None = None, offsets: np.ndarray | None = None
    ) -> None:
        self.keys = keys
        self.rows = rows
        self.offsets = offsets

    @property
    def num_keys(self) -> int:
        """How many keys."""
        return int(self.keys.num_rows)

    def counts(self) -> np.ndarray:
        """The number of rows of each key (int64, one per key)."""
        if self.offsets is None:
            return np.zeros(self.num_keys, np.int64)
        return np.diff(self.offsets).astype(np.int64)

    def key_index(self) -> np.ndarray:
        """For each row of ``rows``, the position of its key (for ``np.bincount``,
        ``np.maximum.reduceat`` and the like)."""
        return np.repeat(np.arange(self.num_keys, dtype=np.int64), self.counts())

    def rows_of(self, i: int) -> pa.Table:
        """The rows of key ``i``."""
        if self.rows is None or self.offsets is None:
            raise HeadraceError("this KeyBatch carries no rows (expired timers have none)")
        return self.rows.slice(int(self.offsets[i]), int(self.offsets[i + 1] - self.offsets[i]))

    def __repr__(self) -> str:
        return f"KeyBatch({self.num_keys} keys, {0 if self.rows is None else self.rows.num_rows} rows)"


_UNREAD = object()  # a slot whose stored row is not read yet
_NO_KEYS = object()  # what a variable holds slots for before its first use


class KeySet:
    """The grouping keys a run of per-key calls is for (the batch's keys with rows, the keys
    whose timers fire, ...): ``table``, their key columns, each key once, and ``keys``, the
    same as tuples (``None`` where no call needs them). A state variable holds one entry per
    position of the handle's current key set; the call for ``keys[i]`` runs with the handle
    at position ``i``. Built by the operator on its thread."""

    __slots__ = ("keys", "table")

    def __init__(self, keys: list[tuple[Any, ...]] | None, table: pa.Table) -> None:
        self.keys = keys
        self.table = table

    def __len__(self) -> int:
        return int(self.table.num_rows)


def _where(where: Any, n: int, what: str) -> np.ndarray | None:
    """The positions a ``where`` mask (``None``: every key) selects."""
    if where is None:
        return None
    mask = np.asarray(where.to_numpy(zero_copy_only=False) if isinstance(where, pa.Array | pa.ChunkedArray)
                      else where)  # fmt: skip
    if mask.dtype != np.bool_ or mask.shape != (n,):
        raise HeadraceError(f"{what}: where= must be a boolean array of one value per key ({n}), not "
                            f"{mask.dtype} of shape {mask.shape}")  # fmt: skip
    return np.flatnonzero(mask)


def _int64s(values: Any, n: int, what: str) -> np.ndarray:
    arr = values.to_numpy(zero_copy_only=False) if isinstance(values, pa.Array | pa.ChunkedArray) else values
    out = np.asarray(arr)
    if out.shape == ():
        out = np.full(n, out)
    if out.shape != (n,) or not np.issubdtype(out.dtype, np.integer):
        raise HeadraceError(f"{what}: give one timestamp in milliseconds (an integer) per key ({n}), not "
                            f"{out.dtype} of shape {out.shape}")  # fmt: skip
    return out.astype(np.int64, copy=False)


def _as_table(values: Any, schema: pa.Schema, n: int, what: str) -> pa.Table:
    """Values given to a ``*_batch`` method: a ``pyarrow.Table``/``RecordBatch``, a pandas
    DataFrame or a mapping of field name to array, cast to ``schema``; one row per key."""
    if isinstance(values, pa.RecordBatch):
        values = pa.Table.from_batches([values])
    elif isinstance(values, Mapping):
        values = pa.table({k: values[k] for k in values})
    elif type(values).__name__ == "DataFrame" and hasattr(values, "columns"):
        values = pa.Table.from_pandas(values, preserve_index=False)
    elif isinstance(values, pa.Array | pa.ChunkedArray | np.ndarray | list) and len(schema) == 1:
        values = pa.table({schema.names[0]: values})
    if not isinstance(values, pa.Table):
        raise HeadraceError(f"{what}: give the values as a pyarrow.Table (or a mapping of field to array) with "
                            f"the fields {_spark_schema(schema)}, not {type(values).__name__}")  # fmt: skip
    missing = [f for f in schema.names if f not in values.column_names]
    if missing:
        raise HeadraceError(
            f"{what}: the values have no field {', '.join(missing)} (schema: {_spark_schema(schema)})"
        )
    if values.num_rows != n:
        raise HeadraceError(f"{what}: {values.num_rows} value rows for {n} keys; give one row per key (and select "
                            "keys with where=)")  # fmt: skip
    try:
        return values.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
        raise HeadraceError(f"{what}: the values do not cast to {_spark_schema(schema)}: {e}") from None


def parse_state_schema(schema: Any, what: str) -> pa.Schema:
    """A variable's schema: a DDL string (``"n BIGINT, ts TIMESTAMP"``), a ``pyarrow.Schema``,
    or a ``pyarrow.DataType`` (one field ``value``). Raises ``HeadraceError`` naming it."""
    from headrace.sql_types import ddl_to_schema

    if isinstance(schema, pa.Schema):
        out = schema
    elif isinstance(schema, pa.DataType):
        out = pa.schema([pa.field("value", schema)])
    elif isinstance(schema, str):
        try:
            out = ddl_to_schema(schema)
        except ValueError as e:
            raise HeadraceError(f"{what}: schema {schema!r}: {e}") from None
    else:
        raise HeadraceError(
            f"{what}: the schema must be a DDL string such as 'n BIGINT', not {type(schema).__name__}"
        )
    if not len(out):
        raise HeadraceError(
            f"{what}: the schema {schema!r} has no fields; give at least one, e.g. 'n BIGINT'"
        )
    return out


def timer_timestamp(value: Any, what: str) -> int:
    """A timer's time in milliseconds since the epoch (an int, not a bool), as ``what`` was given
    it; anything else is a HeadraceError naming the value."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise HeadraceError(f"{what}: {value!r} is not a timestamp in milliseconds (an int)")
    return int(value)


def parse_ttl(ttl: Any, what: str) -> int | None:
    """A TTL in milliseconds: ``None`` (no TTL), a duration (``"1 hour"``, a ``timedelta``) or a
    whole number of milliseconds (PySpark's ``ttlDurationMs``). Must be positive."""
    if ttl is None:
        return None
    if isinstance(ttl, bool):
        raise HeadraceError(
            f"{what}: ttl={ttl!r} is not a duration; write e.g. ttl='1 hour' or ttl=3_600_000 (ms)"
        )
    if isinstance(ttl, int):
        ms = ttl
    else:
        from headrace.options import Duration

        try:
            ms = round(Duration().parse(ttl) * 1000)
        except ValueError as e:
            raise HeadraceError(f"{what}: ttl: {e}") from None
    if ms <= 0:
        raise HeadraceError(f"{what}: ttl must be positive (Spark's STATEFUL_PROCESSOR_TTL_DURATION_MUST_BE_POSITIVE), "
                            f"not {ttl!r}; leave it out for state that never expires")  # fmt: skip
    return int(ms)


def _spark_schema(schema: pa.Schema) -> str:
    from headrace.sql_types import arrow_to_spark_name

    return ", ".join(f"{f.name} {arrow_to_spark_name(f.type)}" for f in schema)


def _as_tuple(value: Any, schema: pa.Schema, what: str) -> tuple[Any, ...]:
    """A value given by the processor as the tuple of its fields (PySpark's), a mapping by
    field name, or, for a one-field schema, the bare value."""
    if type(value) is tuple and len(value) == len(schema):  # the common case, before the ABC check
        return value
    if isinstance(value, Mapping):
        missing = [n for n in schema.names if n not in value]
        if missing:
            raise HeadraceError(f"{what}: the value {value!r} has no field {', '.join(missing)} (schema: "
                                f"{_spark_schema(schema)})")  # fmt: skip
        return tuple(value[n] for n in schema.names)
    if isinstance(value, tuple | list):
        if len(value) != len(schema):
            raise HeadraceError(f"{what}: the value {tuple(value)!r} has {len(value)} fields, the schema "
                                f"{_spark_schema(schema)} has {len(schema)}")  # fmt: skip
        return tuple(value)
    if len(schema) == 1:
        return (value,)
    raise HeadraceError(f"{what}: give the value as a tuple of {_spark_schema(schema)}, not {value!r}")


def _struct_dict(t: tuple[Any, ...] | None, schema: pa.Schema) -> dict[str, Any] | None:
    return None if t is None else dict(zip(schema.names, t, strict=True))


def _struct_tuple(d: Mapping[str, Any] | None, schema: pa.Schema) -> tuple[Any, ...] | None:
    return None if d is None else tuple(d[n] for n in schema.names)


class _Variable:
    """A declared state variable: its store, and the rows of the batch's keys while it runs."""

    kind = ""

    def __init__(
        self, handle: StatefulProcessorHandle, name: str, schema: pa.Schema, ttl_ms: int | None
    ) -> None:
        self._handle = handle
        self.name = name
        self.schema = schema
        self.ttl_ms = ttl_ms
        self.store: StateStore | None = None
        # the entries of the handle's current key set, by position (read in one ``get`` at the
        # first read); ``_slots_for``/``_read_for``: the key set they belong to / were read for
        self._vals: list[Any] = []
        self._dirty: list[int] = []  # positions written (repeats allowed)
        self._slots_for: object = _NO_KEYS
        self._read_for: object = _NO_KEYS
        self._last_read: tuple[KeyBatch, pa.Table, np.ndarray] | None = None

    # -------------------------------------------------------------- what the store holds
    def value_schema(self) -> pa.Schema:
        raise NotImplementedError

    def spec(self) -> str:
        """How the operator's description records this variable (name, kind, schema; not
        the TTL, which may change between runs as in Spark)."""
        return f"{self.name}: {self.kind}<{_spark_schema(self.schema)}>"

    def _decode(self, row: Mapping[str, Any] | None) -> Any:
        raise NotImplementedError

    def _encode(self, entry: Any) -> tuple[dict[str, Any] | None, int | None]:
        """The stored row of ``entry`` and its order (earliest expiry); ``(None, None)``: none."""
        raise NotImplementedError

    def _empty(self) -> Any:
        raise NotImplementedError

    def _unexpired(self, entry: Any, now: int) -> Any:
        raise NotImplementedError

    # -------------------------------------------------------------- per batch
    def reset(self) -> None:
        """Forget the entries held (unwritten changes too: :meth:`flush` first)."""
        self._vals = []
        self._dirty = []
        self._slots_for = self._read_for = _NO_KEYS
        self._last_read = None

    def _load(self, read: bool) -> None:
        """Make the slots of the handle's current key set (one per key, unread); with
        ``read``, read the rows of the keys whose slot is unread in one ``get``. Called at
        a variable's first use within a run of per-key calls."""
        handle = self._handle
        keys = handle._keyset
        if handle._key is None:
            handle._current_key()  # raises: no grouping key
        if keys is None:
            raise AssertionError(f"{self.name}: a per-key call outside a run of per-key calls")
        if self._slots_for is not keys:
            if self._dirty:
                raise AssertionError(f"{self.name}: unwritten changes of another key set")
            self._vals = [_UNREAD] * len(keys)
            self._slots_for = keys
        if read and self._read_for is not keys:
            assert self.store is not None
            vals = self._vals
            if not self._dirty:  # nothing written yet: every slot is unread
                values, found = self.store.get(keys.table)
                self._vals = vals = self._decode_many(values, found)
            else:
                todo = [i for i, v in enumerate(vals) if v is _UNREAD]
                if todo:
                    values, found = self.store.get(keys.table.take(pa.array(todo, pa.int64())))
                    for i, entry in zip(todo, self._decode_many(values, found), strict=True):
                        vals[i] = entry
            self._read_for = keys

    def _decode_many(self, values: pa.Table, found: Any) -> list[Any]:
        """The entries of stored rows (``found[i]`` false: no row)."""
        rows = values.to_pylist()
        return [self._decode(r) if f else self._empty() for r, f in zip(rows, found, strict=True)]

    def _encode_many(self, entries: list[Any]) -> tuple[pa.Table, pa.Array]:
        """The stored rows of non-empty ``entries`` and their orders."""
        rows, orders = [], []
        for e in entries:
            row, order = self._encode(e)
            rows.append(row)
            orders.append(order)
        return pa.Table.from_pylist(rows, schema=self.value_schema()), pa.array(orders, pa.int64())

    def _entry(self) -> Any:
        """The current key's entry."""
        handle = self._handle
        if self._read_for is not handle._keyset:
            self._load(True)
        return self._vals[handle._pos]

    def _set(self, entry: Any) -> None:
        """Replace the current key's entry."""
        handle = self._handle
        if self._slots_for is not handle._keyset:
            self._load(False)
        pos = handle._pos
        self._vals[pos] = entry
        self._dirty.append(pos)

    def _now(self) -> int:
        return self._handle._timer_values.current_processing_time_ms

    def _expiry(self) -> int | None:
        return None if self.ttl_ms is None else self._now() + self.ttl_ms

    def flush(self) -> None:
        """Write the changed entries back: one ``put``, one ``remove`` (the keys taken from
        the key set's table, no key converted from Python)."""
        assert self.store is not None
        if not self._dirty:
            return
        keys = self._slots_for
        assert isinstance(keys, KeySet)
        positions = sorted(set(self._dirty))
        self._dirty = []
        vals = self._vals
        put_pos, put_entries, gone = [], [], []
        for p in positions:
            entry = vals[p]
            if not entry:  # None, [] or {}: no row
                gone.append(p)
            else:
                put_pos.append(p)
                put_entries.append(entry)
        if gone:
            self.store.remove(keys.table.take(pa.array(gone, pa.int64())))
        if put_pos:
            values, order = self._encode_many(put_entries)
            # every key of the set: its own table, the one the read looked up (a store may keep
            # what that lookup found for the write of the same keys)
            table = (
                keys.table if len(put_pos) == len(keys) else keys.table.take(pa.array(put_pos, pa.int64()))
            )
            self.store.put(table, values, order)

    def expire(self, now: int) -> None:
        """Remove what expired at processing time ``now``: the rows whose earliest expiry is
        ``<= now`` are evicted, and those still holding unexpired items written back."""
        assert self.store is not None
        if self.ttl_ms is None and self.store.earliest_order() is None:
            return
        earliest = self.store.earliest_order()
        if earliest is None or earliest > now:
            return
        out = self.store.evict(now)
        if not out.num_rows:
            return
        self.reset()
        rows = out.select(self.value_schema().names).to_pylist()
        self._vals = [self._unexpired(self._decode(row), now) for row in rows]
        self._slots_for = self._read_for = KeySet(None, out.select(self.store.key_schema.names))
        self._dirty = list(range(len(rows)))
        self.flush()
        self.reset()

    def purge(self) -> None:
        """Remove every row (``handle.delete_if_exists``): reads the whole variable."""
        assert self.store is not None
        rows = self.store.scan()
        if rows.num_rows:
            self.store.remove(rows.select(self.store.key_schema.names))
        self.reset()


class ValueState(_Variable):
    """One value per grouping key (Spark's ``ValueState``). Methods act on the key the
    processor is being called for; call them from ``handle_input_rows``,
    ``handle_expired_timer`` or ``handle_initial_state`` only, on the engine's thread."""

    kind = "value"

    def __init__(
        self, handle: StatefulProcessorHandle, name: str, schema: pa.Schema, ttl_ms: int | None
    ) -> None:
        super().__init__(handle, name, schema, ttl_ms)
        self._width = len(schema)

    def value_schema(self) -> pa.Schema:
        # one column per field (``value.<field>``), not a struct: both backends keep flat
        # columns of primitive types without Python objects
        fields = [pa.field(f"value.{f.name}", f.type) for f in self.schema]
        return pa.schema([*fields, pa.field("__expires", pa.int64())])

    def _columns(self) -> list[str]:
        return [f"value.{n}" for n in self.schema.names]

    def _decode(self, row: Mapping[str, Any] | None) -> Any:
        if row is None:
            return None
        return (tuple(row[c] for c in self._columns()), row.get("__expires"))

    def _encode(self, entry: Any) -> tuple[dict[str, Any] | None, int | None]:
        if entry is None:
            return None, None
        value, expires = entry
        return {**dict(zip(self._columns(), value, strict=True)), "__expires": expires}, expires

    def _empty(self) -> Any:
        return None

    def _decode_many(self, values: pa.Table, found: Any) -> list[Any]:
        # column by column: a to_pylist per field instead of a dict per row
        valid = np.asarray(found, np.bool_).tolist()
        tuples = list(zip(*(values.column(c).to_pylist() for c in self._columns()), strict=True))
        expires = values.column("__expires").to_pylist()
        return [(t, e) if v else None for t, e, v in zip(tuples, expires, valid, strict=True)]

    def _encode_many(self, entries: list[Any]) -> tuple[pa.Table, pa.Array]:
        values = [v for v, _ in entries]
        arrays = [pa.array([v[i] for v in values], f.type) for i, f in enumerate(self.schema)]
        if self.ttl_ms is None and all(e is None for _, e in entries):
            expires = pa.nulls(len(entries), pa.int64())
        else:
            expires = pa.array([e for _, e in entries], pa.int64())
        return pa.Table.from_arrays([*arrays, expires], schema=self.value_schema()), expires

    def _unexpired(self, entry: Any, now: int) -> Any:
        if entry is None or (entry[1] is not None and entry[1] <= now):
            return None
        return entry

    # the per-key methods below are called once per key and batch: each reads the slot of the
    # handle's current position directly (no helper calls on the common path)
    def exists(self) -> bool:
        """Whether the key has a value (not expired)."""
        return self.get() is not None

    def get(self) -> tuple[Any, ...] | None:
        """The key's value as a tuple of the schema's fields, or ``None``."""
        handle = self._handle
        if self._read_for is not handle._keyset:
            self._load(True)
        entry = self._vals[handle._pos]
        if entry is None:
            return None
        expires = entry[1]
        if expires is not None and expires <= handle._timer_values.current_processing_time_ms:
            return None
        value: tuple[Any, ...] = entry[0]
        return value

    def update(self, value: Any) -> None:
        """Set the key's value (a tuple of the schema's fields; for a one-field schema also the
        bare value). Resets its TTL."""
        handle = self._handle
        if self._slots_for is not handle._keyset:
            self._load(False)
        if type(value) is not tuple or len(value) != self._width:
            value = _as_tuple(value, self.schema, f"value state {self.name!r}")
        ttl = self.ttl_ms
        pos = handle._pos
        self._vals[pos] = (
            value,
            None if ttl is None else handle._timer_values.current_processing_time_ms + ttl,
        )
        self._dirty.append(pos)

    def clear(self) -> None:
        """Remove the key's value."""
        self._set(None)

    # -------------------------------------------------------------- batched (KeyBatch)
    def _read_batch(self) -> tuple[pa.Table, np.ndarray]:
        batch = self._handle._current_batch()
        assert self.store is not None
        last = self._last_read
        if last is not None and last[0] is batch:
            return last[1], last[2]
        values, found = self.store.get(batch.keys)
        valid = np.asarray(found, np.bool_)
        if self.ttl_ms is not None:
            exp = values.column("__expires").combine_chunks()
            valid = valid & ~pc.fill_null(pc.less_equal(exp, self._now()), False).to_numpy(
                zero_copy_only=False
            )
        cols = [values.column(c) for c in self._columns()]
        if not valid.all():
            mask = pa.array(valid)
            cols = [pc.if_else(mask, c, pa.nulls(len(c), c.type)) for c in cols]
        out = pa.Table.from_arrays(cols, schema=self.schema)
        self._last_read = (batch, out, valid)  # until a write: exists_batch then get_batch read once
        return out, valid

    def exists_batch(self) -> np.ndarray:
        """Batched :meth:`exists`: one bool per key of the :class:`KeyBatch`."""
        return self._read_batch()[1].copy()

    def get_batch(self) -> pa.Table:
        """Batched :meth:`get`: a table of the variable's fields, one row per key of the
        :class:`KeyBatch` (in its order); all nulls where :meth:`exists_batch` is false."""
        return self._read_batch()[0]

    def update_batch(self, values: Any, where: Any = None) -> None:
        """Batched :meth:`update`: ``values`` (a ``pyarrow.Table``, a mapping of field name to
        array, a pandas DataFrame) holds one row per key of the :class:`KeyBatch`; ``where`` (a
        boolean array per key) selects the keys updated (default all). Resets their TTL."""
        batch = self._handle._current_batch()
        assert self.store is not None
        self._last_read = None
        n = batch.num_keys
        what = f"value state {self.name!r} update_batch"
        table = _as_table(values, self.schema, n, what)
        keys = batch.keys
        idx = _where(where, n, what)
        if idx is not None:
            keys, table = keys.take(idx), table.take(idx)
        if not keys.num_rows:
            return
        exp = self._expiry()
        expires = (
            pa.nulls(keys.num_rows, pa.int64()) if exp is None else pa.array(np.full(keys.num_rows, exp))
        )
        self.store.put(
            keys, pa.Table.from_arrays([*table.columns, expires], schema=self.value_schema()), expires
        )

    def clear_batch(self, where: Any = None) -> None:
        """Batched :meth:`clear`: remove the values of the :class:`KeyBatch`'s keys (those
        ``where`` selects, default all)."""
        batch = self._handle._current_batch()
        assert self.store is not None
        self._last_read = None
        idx = _where(where, batch.num_keys, f"value state {self.name!r} clear_batch")
        self.store.remove(batch.keys if idx is None else batch.keys.take(idx))


class ListState(_Variable):
    """A list of values per grouping key (Spark's ``ListState``); each element has its own TTL."""

    kind = "list"

    def value_schema(self) -> pa.Schema:
        item = pa.struct([pa.field("value", pa.struct(list(self.schema))), pa.field("expires", pa.int64())])
        return pa.schema([pa.field("__items", pa.list_(item))])

    def _decode(self, row: Mapping[str, Any] | None) -> Any:
        items = (row or {}).get("__items") or []
        return [(_struct_tuple(i["value"], self.schema), i["expires"]) for i in items]

    def _encode(self, entry: Any) -> tuple[dict[str, Any] | None, int | None]:
        if not entry:
            return None, None
        expiries = [e for _, e in entry if e is not None]
        items = [{"value": _struct_dict(v, self.schema), "expires": e} for v, e in entry]
        return {"__items": items}, min(expiries) if expiries else None

    def _empty(self) -> Any:
        return []

    def _unexpired(self, entry: Any, now: int) -> Any:
        return [(v, e) for v, e in entry if e is None or e > now]

    def exists(self) -> bool:
        """Whether the key's list has an element (not expired)."""
        return bool(self._unexpired(self._entry(), self._now()))

    def get(self) -> Iterator[tuple[Any, ...]]:
        """The key's elements, in order, each a tuple of the schema's fields."""
        return iter([v for v, _ in self._unexpired(self._entry(), self._now())])

    def put(self, values: Sequence[Any]) -> None:
        """Replace the key's list (an empty list clears it)."""
        exp = self._expiry()
        self._set([(_as_tuple(v, self.schema, f"list state {self.name!r}"), exp) for v in values])

    def append_value(self, value: Any) -> None:
        """Append one element."""
        self.append_list([value])

    def append_list(self, values: Sequence[Any]) -> None:
        """Append elements, in order."""
        exp = self._expiry()
        cur = self._unexpired(self._entry(), self._now())
        self._set([*cur, *((_as_tuple(v, self.schema, f"list state {self.name!r}"), exp) for v in values)])

    def clear(self) -> None:
        """Remove the key's list."""
        self._set([])

    append = append_value
    appendValue = append_value
    appendList = append_list


class MapState(_Variable):
    """A map per grouping key (Spark's ``MapState``): user keys of ``user_key_schema`` to values
    of ``schema``; each entry has its own TTL."""

    kind = "map"

    def __init__(self, handle: StatefulProcessorHandle, name: str, key_schema: pa.Schema, schema: pa.Schema,
                 ttl_ms: int | None) -> None:  # fmt: skip
        super().__init__(handle, name, schema, ttl_ms)
        self.user_key_schema = key_schema

    def spec(self) -> str:
        return f"{self.name}: map<{_spark_schema(self.user_key_schema)} -> {_spark_schema(self.schema)}>"

    def value_schema(self) -> pa.Schema:
        entry = pa.struct([pa.field("key", pa.struct(list(self.user_key_schema))),
                           pa.field("value", pa.struct(list(self.schema))), pa.field("expires", pa.int64())])  # fmt: skip
        return pa.schema([pa.field("__entries", pa.list_(entry))])

    def _decode(self, row: Mapping[str, Any] | None) -> Any:
        entries = (row or {}).get("__entries") or []
        return {_struct_tuple(e["key"], self.user_key_schema): (_struct_tuple(e["value"], self.schema), e["expires"])
                for e in entries}  # fmt: skip

    def _encode(self, entry: Any) -> tuple[dict[str, Any] | None, int | None]:
        if not entry:
            return None, None
        expiries = [e for _, e in entry.values() if e is not None]
        rows = [{"key": _struct_dict(k, self.user_key_schema), "value": _struct_dict(v, self.schema), "expires": e}
                for k, (v, e) in entry.items()]  # fmt: skip
        return {"__entries": rows}, min(expiries) if expiries else None

    def _empty(self) -> Any:
        return {}

    def _unexpired(self, entry: Any, now: int) -> Any:
        return {k: (v, e) for k, (v, e) in entry.items() if e is None or e > now}

    def _ukey(self, key: Any) -> tuple[Any, ...]:
        return _as_tuple(key, self.user_key_schema, f"map state {self.name!r} key")

    def _live(self) -> dict[tuple[Any, ...], tuple[Any, Any]]:
        live: dict[tuple[Any, ...], tuple[Any, Any]] = self._unexpired(self._entry(), self._now())
        return live

    def exists(self) -> bool:
        """Whether the key's map has an entry (not expired)."""
        return bool(self._live())

    def get_value(self, key: Any) -> tuple[Any, ...] | None:
        """The value of user key ``key``, or ``None``."""
        hit = self._live().get(self._ukey(key))
        return None if hit is None else hit[0]

    def contains_key(self, key: Any) -> bool:
        """Whether user key ``key`` has a value."""
        return self._ukey(key) in self._live()

    def update_value(self, key: Any, value: Any) -> None:
        """Set the value of user key ``key`` (resets that entry's TTL)."""
        live = dict(self._live())
        live[self._ukey(key)] = (
            _as_tuple(value, self.schema, f"map state {self.name!r} value"),
            self._expiry(),
        )
        self._set(live)

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """``(user key, value)`` pairs, in insertion order."""
        return iter([(k, v) for k, (v, _) in self._live().items()])

    def keys(self) -> Iterator[tuple[Any, ...]]:
        """The user keys."""
        return iter(list(self._live()))

    def values(self) -> Iterator[tuple[Any, ...]]:
        """The values."""
        return iter([v for v, _ in self._live().values()])

    def remove_key(self, key: Any) -> None:
        """Remove user key ``key`` (absent: nothing happens)."""
        live = dict(self._live())
        live.pop(self._ukey(key), None)
        self._set(live)

    def clear(self) -> None:
        """Remove the key's map."""
        self._set({})

    getValue = get_value
    containsKey = contains_key
    updateValue = update_value
    removeKey = remove_key


class Timers(_Variable):
    """The timers of each grouping key: sorted timestamps (ms), the earliest as the order.
    Stored as ``__timer`` (the earliest, int64) and ``__later`` (the others, a list; null when
    none): a key with one timer, the common case, is one integer in either store."""

    kind = "timers"

    def value_schema(self) -> pa.Schema:
        return pa.schema([pa.field("__timer", pa.int64()), pa.field("__later", pa.list_(pa.int64()))])

    def _decode(self, row: Mapping[str, Any] | None) -> Any:
        if row is None or row.get("__timer") is None:
            return []
        return [row["__timer"], *(row.get("__later") or [])]

    def _encode(self, entry: Any) -> tuple[dict[str, Any] | None, int | None]:
        if not entry:
            return None, None
        return {"__timer": entry[0], "__later": list(entry[1:]) or None}, entry[0]

    def _decode_many(self, values: pa.Table, found: Any) -> list[Any]:
        if values.column("__later").null_count == values.num_rows:  # one timer per key at most
            return [[] if t is None else [t] for t in values.column("__timer").to_pylist()]
        parent, times = self.flatten(values)
        out: list[list[int]] = [[] for _ in range(values.num_rows)]
        for p, t in zip(parent.tolist(), times.tolist(), strict=True):
            out[p].append(t)
        return out

    def _encode_many(self, entries: list[Any]) -> tuple[pa.Table, pa.Array]:
        parent = np.repeat(np.arange(len(entries), dtype=np.int64), [len(e) for e in entries])
        times = np.fromiter((t for e in entries for t in e), np.int64, count=len(parent))
        table, order, _ = self.build(len(entries), parent, times)
        return table, order

    @staticmethod
    def flatten(values: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """The stored rows' timers as ``(row position, timestamp)`` arrays, sorted by both."""
        first = values.column("__timer").combine_chunks()
        later = values.column("__later").combine_chunks()
        has = first.is_valid().to_numpy(zero_copy_only=False)
        p0 = np.flatnonzero(has).astype(np.int64)
        t0 = first.to_numpy(zero_copy_only=False)[has].astype(np.int64) if len(p0) else np.zeros(0, np.int64)
        if later.null_count == len(later):
            return p0, t0
        p1 = pc.list_parent_indices(later).to_numpy(zero_copy_only=False).astype(np.int64)
        t1 = pc.list_flatten(later).to_numpy(zero_copy_only=False).astype(np.int64)
        parent, times = np.concatenate([p0, p1]), np.concatenate([t0, t1])
        order = np.lexsort((times, parent))
        return parent[order], times[order]

    def build(self, m: int, parent: np.ndarray, times: np.ndarray) -> tuple[pa.Table, pa.Array, np.ndarray]:
        """Stored rows of ``m`` keys from sorted ``(row position, timestamp)`` arrays: the
        value table, the order (earliest timer) and which keys have a timer."""
        counts = np.bincount(parent, minlength=m)
        offsets = np.zeros(m + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        has = counts > 0
        first = np.zeros(m, np.int64)
        first[has] = times[offsets[:-1][has]]
        first_arr = pa.array(first, pa.int64(), mask=~has)
        rest = counts > 1
        if rest.any():
            is_first = np.zeros(len(times), np.bool_)
            is_first[offsets[:-1][has]] = True
            later_counts = np.maximum(counts - 1, 0)
            later_off = np.zeros(m + 1, np.int32)
            np.cumsum(later_counts, out=later_off[1:])
            later = pa.ListArray.from_arrays(pa.array(later_off), pa.array(times[~is_first], pa.int64()),
                                             mask=pa.array(~rest))  # fmt: skip
        else:
            later = pa.nulls(m, pa.list_(pa.int64()))
        return pa.Table.from_arrays([first_arr, later], schema=self.value_schema()), first_arr, has

    def _empty(self) -> Any:
        return []

    def _unexpired(self, entry: Any, now: int) -> Any:
        return entry

    def register(self, ts: int) -> None:
        handle = self._handle
        if self._read_for is not handle._keyset:
            self._load(True)
        pos = handle._pos
        cur = self._vals[pos]
        if not cur:
            self._vals[pos] = [ts]
        elif ts not in cur:
            self._vals[pos] = sorted([*cur, ts])
        else:
            return
        self._dirty.append(pos)

    def delete(self, ts: int) -> None:
        cur = self._entry()
        if ts in cur:
            self._set([t for t in cur if t != ts])

    def current(self) -> list[int]:
        return list(self._entry())

    def change_batch(self, keys: pa.Table, ts: np.ndarray, add: bool) -> None:
        """Register (``add``) or delete timer ``ts[i]`` of ``keys[i]`` for every ``i`` (keys
        unique): one ``get``, one ``put`` and one ``remove``, no Python work per key."""
        assert self.store is not None
        m = keys.num_rows
        if not m:
            return
        values, found = self.store.get(keys)
        parent, times = self.flatten(values)
        if add:
            parent = np.concatenate([parent, np.arange(m, dtype=np.int64)])
            times = np.concatenate([times, ts])
            order = np.lexsort((times, parent))
            parent, times = parent[order], times[order]
            keep = np.ones(len(times), np.bool_)
            keep[1:] = (parent[1:] != parent[:-1]) | (times[1:] != times[:-1])
        else:
            keep = times != ts[parent]
        table, first, has = self.build(m, parent[keep], times[keep])
        if has.any():
            idx = pa.array(np.flatnonzero(has))
            self.store.put(keys.take(idx), table.take(idx), first.take(idx))
        gone = np.flatnonzero(~has & np.asarray(found, np.bool_))
        if len(gone):
            self.store.remove(keys.take(pa.array(gone)))

    def lists_batch(self, keys: pa.Table) -> pa.ListArray:
        """The timers of each of ``keys`` (an empty list where none)."""
        assert self.store is not None
        values, _ = self.store.get(keys)
        parent, times = self.flatten(values)
        offsets = np.zeros(keys.num_rows + 1, np.int32)
        np.cumsum(np.bincount(parent, minlength=keys.num_rows), out=offsets[1:])
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(times, pa.int64()))

    def expired(self, before: int) -> tuple[KeySet, list[tuple[int, int]]]:
        """Take the timers earlier than ``before`` (Spark fires a timer once the time passes
        it): the rows whose earliest timer is earlier are evicted from the store and held as
        the slots of a new key set (written back by :meth:`flush` with what is left);
        returns that key set and ``(timestamp, position)`` pairs in time order."""
        assert self.store is not None
        earliest = self.store.earliest_order()
        if earliest is None or earliest >= before:
            return KeySet([], self._handle._key_schema.empty_table()), []
        out = self.store.evict(before - 1)
        keys = out.select(self._handle._key_schema.names)
        keyset = KeySet(self._handle._keys_of(keys), keys)
        self.reset()
        self._vals = self._decode_many(out, None)
        self._slots_for = self._read_for = keyset
        self._dirty = list(range(len(self._vals)))  # evicted: written back with what is left
        fired = [(t, p) for p, timers in enumerate(self._vals) for t in timers if t < before]
        fired.sort(key=lambda f: f[0])
        return keyset, fired


class StatefulProcessorHandle:
    """What a :class:`StatefulProcessor` declares its state on (in ``init``) and registers its
    timers with (Spark's ``StatefulProcessorHandle``). Built by the operator once per query
    run; ``get_*_state`` are called from ``init`` only; timers and ``delete_if_exists`` act
    on the key the processor is being called for, on the engine's thread."""

    def __init__(self, time_mode: str, key_schema: pa.Schema, *, declaring: bool = True) -> None:
        self._time_mode = time_mode
        self._key_schema = key_schema
        self._variables: dict[str, _Variable] = {}
        self._declaring = declaring
        # the per-key call running: its key, the key set of the run of calls it belongs to
        # (each variable reads the rows of all of them at its first use) and its position there
        self._key: tuple[Any, ...] | None = None
        self._keyset: KeySet | None = None
        self._pos = -1
        self._batch: KeyBatch | None = None
        self._timer_values = TimerValues()
        self._timers = Timers(self, "__timers", pa.schema([pa.field("t", pa.int64())]), None)
        self._purge: list[str] = []
        self.real_time = False

    # -------------------------------------------------------------- declarations (init)
    def _declare(self, var: _Variable) -> Any:
        what = f"{var.kind} state {var.name!r}"
        if not self._declaring:
            raise HeadraceError(f"{what}: state variables are declared in the processor's init(handle) only")
        if not isinstance(var.name, str) or not NAME_RE.fullmatch(var.name):
            raise HeadraceError(f"state variable name {var.name!r}: use letters, digits and '_' (up to 100, not "
                                "starting with a digit), e.g. 'count'")  # fmt: skip
        if var.name in self._variables:
            raise HeadraceError(f"{what} is declared twice in init(); give each state variable its own name")
        if var.ttl_ms is not None and self._time_mode != "processing_time":
            raise UnsupportedError(f"{what}: a TTL needs time_mode 'processing_time', and time_mode is "
                                   f"{self._time_mode!r} (Spark's STATEFUL_PROCESSOR_INCORRECT_TIME_MODE_TO_ASSIGN_TTL); "
                                   "use time_mode='processing_time', or drop the ttl")  # fmt: skip
        self._variables[var.name] = var
        return var

    def get_value_state(self, name: str, schema: Any, ttl: Any = None, *, ttl_duration_ms: int | None = None
                        ) -> ValueState:  # fmt: skip
        """Declare a value state variable: ``schema`` a DDL string (``"n BIGINT"``), ``ttl`` a
        duration (``"1 hour"``) or milliseconds."""
        what = f"value state {name!r}"
        t = parse_ttl(ttl if ttl is not None else ttl_duration_ms, what)
        out: ValueState = self._declare(ValueState(self, name, parse_state_schema(schema, what), t))
        return out

    def get_list_state(self, name: str, schema: Any, ttl: Any = None, *, ttl_duration_ms: int | None = None
                       ) -> ListState:  # fmt: skip
        """Declare a list state variable (elements of ``schema``)."""
        what = f"list state {name!r}"
        t = parse_ttl(ttl if ttl is not None else ttl_duration_ms, what)
        out: ListState = self._declare(ListState(self, name, parse_state_schema(schema, what), t))
        return out

    def get_map_state(self, name: str, user_key_schema: Any, value_schema: Any, ttl: Any = None, *,
                      ttl_duration_ms: int | None = None) -> MapState:  # fmt: skip
        """Declare a map state variable (user keys of ``user_key_schema`` to ``value_schema``)."""
        what = f"map state {name!r}"
        t = parse_ttl(ttl if ttl is not None else ttl_duration_ms, what)
        ks, vs = parse_state_schema(user_key_schema, what + " key"), parse_state_schema(value_schema, what)
        out: MapState = self._declare(MapState(self, name, ks, vs, t))
        return out

    def delete_if_exists(self, name: str) -> None:
        """Remove every row of state variable ``name`` (Spark's ``deleteIfExists``): done at the
        start of the run's first batch, once per run; nothing when no such variable is
        declared."""
        if name in self._variables and name not in self._purge:
            self._purge.append(name)

    # -------------------------------------------------------------- timers
    def _check_timers(self, what: str) -> None:
        self._check_timer_mode(what)
        if self._key is None:
            raise HeadraceError(f"{what}: timers belong to a grouping key; call it from handle_input_rows, "
                                "handle_expired_timer or handle_initial_state")  # fmt: skip

    def _check_timer_mode(self, what: str) -> None:
        if self._time_mode == "none":
            raise UnsupportedError(f"{what}: timers need time_mode 'processing_time' or 'event_time', and this "
                                   "transform_with_state has time_mode 'none' (Spark's "
                                   "STATEFUL_PROCESSOR_CANNOT_PERFORM_OPERATION_WITH_INVALID_TIME_MODE)")  # fmt: skip

    def register_timer(self, expiry_timestamp_ms: int) -> None:
        """Register a timer for the current key at ``expiry_timestamp_ms`` (processing time or
        event time, as the time mode says); it fires once the time passes it."""
        if self._key is None or self._time_mode == "none":
            self._check_timers("register_timer")
        if type(expiry_timestamp_ms) is not int:
            expiry_timestamp_ms = timer_timestamp(expiry_timestamp_ms, "register_timer")
        self._timers.register(expiry_timestamp_ms)

    def delete_timer(self, expiry_timestamp_ms: int) -> None:
        """Delete the current key's timer at ``expiry_timestamp_ms`` (absent: nothing)."""
        self._check_timers("delete_timer")
        self._timers.delete(int(expiry_timestamp_ms))

    def list_timers(self) -> Iterator[int]:
        """The current key's timers, earliest first."""
        self._check_timers("list_timers")
        return iter(self._timers.current())

    # -------------------------------------------------------------- timers, batched (KeyBatch)
    def register_timer_batch(self, expiry_timestamps_ms: Any, where: Any = None) -> None:
        """Batched :meth:`register_timer`: timer ``expiry_timestamps_ms[i]`` (an integer array,
        or one integer for all) for each key ``i`` of the :class:`KeyBatch` (those ``where``
        selects, default all)."""
        self._timer_batch(expiry_timestamps_ms, where, True, "register_timer_batch")

    def delete_timer_batch(self, expiry_timestamps_ms: Any, where: Any = None) -> None:
        """Batched :meth:`delete_timer` (absent timers: nothing)."""
        self._timer_batch(expiry_timestamps_ms, where, False, "delete_timer_batch")

    def list_timers_batch(self) -> pa.ListArray:
        """Batched :meth:`list_timers`: each key's timers, earliest first (a list per key)."""
        self._check_timer_mode("list_timers_batch")
        return self._timers.lists_batch(self._current_batch().keys)

    def _timer_batch(self, ts: Any, where: Any, add: bool, what: str) -> None:
        self._check_timer_mode(what)
        batch = self._current_batch()
        times = _int64s(ts, batch.num_keys, what)
        idx = _where(where, batch.num_keys, what)
        keys = batch.keys
        if idx is not None:
            keys, times = keys.take(idx), times[idx]
        self._timers.change_batch(keys, times, add)

    def _current_batch(self) -> KeyBatch:
        if self._batch is None:
            raise HeadraceError("the *_batch methods act on the keys of handle_input_batch or "
                                "handle_expired_timer_batch; call them from those methods only (per key, "
                                "use get/update/register_timer)")  # fmt: skip
        return self._batch

    getValueState = get_value_state
    getListState = get_list_state
    getMapState = get_map_state
    registerTimer = register_timer
    deleteTimer = delete_timer
    listTimers = list_timers
    deleteIfExists = delete_if_exists

    # -------------------------------------------------------------- for the operator
    def _current_key(self) -> tuple[Any, ...]:
        if self._key is None:
            raise HeadraceError("state variables belong to a grouping key; use them from handle_input_rows, "
                                "handle_expired_timer or handle_initial_state, not from init or close (in "
                                "handle_input_batch and handle_expired_timer_batch, use the value state's *_batch "
                                "methods; list and map state have none: use handle_input_rows)")  # fmt: skip
        return self._key

    def _keys_of(self, table: pa.Table) -> list[tuple[Any, ...]]:
        cols = [table.column(n).to_pylist() for n in self._key_schema.names]
        return list(zip(*cols, strict=True)) if cols else []

    def _begin(self, keys: KeySet) -> None:
        """Start a run of per-key calls for ``keys`` (the operator sets ``_key`` and ``_pos``
        before each call)."""
        self._keyset = keys

    def _end(self) -> None:
        """End the run of per-key calls: every variable's changes written back, its slots
        forgotten."""
        self._key, self._keyset, self._pos = None, None, -1
        for v in self._all():
            v.flush()
            v.reset()

    def _abandon(self) -> None:
        """End a run of per-key calls that failed: nothing written back (the batch fails; a
        retry loads the state of the batch before)."""
        self._key, self._keyset, self._pos = None, None, -1
        for v in self._all():
            v.reset()

    def _all(self) -> list[_Variable]:
        return [self._timers, *self._variables.values()]

"""A headrace :class:`~headrace.transforms.transform_with_state.StatefulProcessor` run by
Spark's ``transformWithStateInPandas``: the step ``group_by(keys).transform_with_state(...)``
of a query started with ``start(..., engine=spark)``.

:class:`SparkStatefulProcessor` is a pyspark ``StatefulProcessor`` that holds the user's
headrace processor and hands it what headrace's own operator would:

- ``init``: a :class:`SparkStateHandle` with headrace's handle API (``get_value_state``,
  ``get_list_state``, ``get_map_state`` with ``ttl`` as a duration or milliseconds, timers,
  ``delete_if_exists``), each state variable a thin wrapper over pyspark's, taking values as
  headrace does (a tuple, a mapping by field name, or for a one-field schema the bare value);
  declarations are checked by headrace's own rules (names, duplicates, a TTL or timers without
  a time mode) so the errors are the same on both engines;
- ``handleInputRows``: the key as a tuple of Python values and the key's rows of the batch as
  one ``pyarrow.Table`` in the stream's Arrow schema (Spark's pandas frames concatenated and
  converted back: integers with nulls, timestamps in the session's time zone);
- ``handleExpiredTimer`` / ``handleInitialState``: headrace's ``TimerValues`` and
  ``ExpiredTimerInfo``; the initial state as a ``pyarrow.Table``;
- whatever the processor yields (tables, record batches, pandas frames, dicts, tuples) is cast
  to the output schema by headrace's own output collector and handed to Spark as one pandas
  frame per call.

The adapter (with the user's processor in it) is pickled by Spark and runs in Spark's Python
workers: ``init`` is called on the driver once (Spark collects the state schemas) and once per
task on the executors. State, timers, TTL and the first-batch initial state are Spark's
(RocksDB state store provider).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import StatefulProcessor as _PySparkProcessor

from headrace.transforms.state_variables import (
    ExpiredTimerInfo,
    StatefulProcessorHandle,
    TimerValues,
    _as_tuple,
    parse_state_schema,
    parse_ttl,
    timer_timestamp,
)
from headrace.transforms.state_variables import ListState as _HrList
from headrace.transforms.state_variables import MapState as _HrMap
from headrace.transforms.state_variables import ValueState as _HrValue

if TYPE_CHECKING:
    import pandas as pd

    from headrace.transforms.transform_with_state import StatefulProcessor

__all__ = ["SPARK_TIME_MODES", "SparkStateHandle", "SparkStatefulProcessor", "check_declarations"]

#: headrace's time modes as Spark names them
SPARK_TIME_MODES = {"none": "None", "processing_time": "ProcessingTime", "event_time": "EventTime"}


def _py(value: Any) -> Any:
    """A numpy/pandas scalar as the Python value headrace hands a processor."""
    if hasattr(value, "to_pydatetime"):
        return value.to_pydatetime()
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        return value.item()
    return value


def _tuple(value: Any) -> tuple[Any, ...] | None:
    return None if value is None else tuple(_py(v) for v in value)


class _SparkValue:
    """Headrace's ``ValueState`` over pyspark's."""

    def __init__(self, state: Any, name: str, schema: pa.Schema) -> None:
        self._state = state
        self.name = name
        self.schema = schema

    def exists(self) -> bool:
        """Whether the key has a value (not expired)."""
        return bool(self._state.exists())

    def get(self) -> tuple[Any, ...] | None:
        """The key's value as a tuple of the schema's fields, or ``None``."""
        return _tuple(self._state.get()) if self._state.exists() else None

    def update(self, value: Any) -> None:
        """Set the key's value (resets its TTL)."""
        self._state.update(_as_tuple(value, self.schema, f"value state {self.name!r}"))

    def clear(self) -> None:
        """Remove the key's value."""
        self._state.clear()


class _SparkList:
    """Headrace's ``ListState`` over pyspark's."""

    def __init__(self, state: Any, name: str, schema: pa.Schema) -> None:
        self._state = state
        self.name = name
        self.schema = schema

    def _items(self, values: Iterable[Any]) -> list[tuple[Any, ...]]:
        return [_as_tuple(v, self.schema, f"list state {self.name!r}") for v in values]

    def exists(self) -> bool:
        """Whether the key's list has an element (not expired)."""
        return bool(self._state.exists())

    def get(self) -> Iterator[tuple[Any, ...]]:
        """The key's elements, in order."""
        if not self._state.exists():
            return iter(())
        return iter([_tuple(v) for v in self._state.get()])  # type: ignore[misc]

    def put(self, values: Iterable[Any]) -> None:
        """Replace the key's list (an empty list clears it)."""
        items = self._items(values)
        if items:
            self._state.put(items)
        else:
            self._state.clear()

    def append_value(self, value: Any) -> None:
        """Append one element."""
        self._state.appendValue(_as_tuple(value, self.schema, f"list state {self.name!r}"))

    def append_list(self, values: Iterable[Any]) -> None:
        """Append elements, in order."""
        items = self._items(values)
        if items:
            self._state.appendList(items)

    def clear(self) -> None:
        """Remove the key's list."""
        self._state.clear()

    append = append_value
    appendValue = append_value
    appendList = append_list


class _SparkMap:
    """Headrace's ``MapState`` over pyspark's."""

    def __init__(self, state: Any, name: str, key_schema: pa.Schema, schema: pa.Schema) -> None:
        self._state = state
        self.name = name
        self.user_key_schema = key_schema
        self.schema = schema

    def _k(self, key: Any) -> tuple[Any, ...]:
        return _as_tuple(key, self.user_key_schema, f"map state {self.name!r} key")

    def exists(self) -> bool:
        """Whether the key's map has an entry (not expired)."""
        return bool(self._state.exists())

    def get_value(self, key: Any) -> tuple[Any, ...] | None:
        """The value of user key ``key``, or ``None``."""
        k = self._k(key)
        return _tuple(self._state.getValue(k)) if self._state.containsKey(k) else None

    def contains_key(self, key: Any) -> bool:
        """Whether user key ``key`` has a value."""
        return bool(self._state.containsKey(self._k(key)))

    def update_value(self, key: Any, value: Any) -> None:
        """Set the value of user key ``key`` (resets that entry's TTL)."""
        self._state.updateValue(self._k(key), _as_tuple(value, self.schema, f"map state {self.name!r} value"))

    def iterator(self) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """``(user key, value)`` pairs."""
        return iter([(_tuple(k), _tuple(v)) for k, v in self._state.iterator()])  # type: ignore[misc]

    def keys(self) -> Iterator[tuple[Any, ...]]:
        """The user keys."""
        return iter([_tuple(k) for k in self._state.keys()])  # type: ignore[misc]  # noqa: SIM118 (pyspark MapState)

    def values(self) -> Iterator[tuple[Any, ...]]:
        """The values."""
        return iter([_tuple(v) for v in self._state.values()])  # type: ignore[misc]

    def remove_key(self, key: Any) -> None:
        """Remove user key ``key`` (absent: nothing happens)."""
        k = self._k(key)
        if self._state.containsKey(k):
            self._state.removeKey(k)

    def clear(self) -> None:
        """Remove the key's map."""
        self._state.clear()

    getValue = get_value
    containsKey = contains_key
    updateValue = update_value
    removeKey = remove_key


class SparkStateHandle:
    """Headrace's ``StatefulProcessorHandle`` API over pyspark's handle. Built by
    :meth:`SparkStatefulProcessor.init`, in Spark's Python worker (and once on the driver);
    used on that worker's thread only."""

    real_time = False

    def __init__(self, handle: Any, time_mode: str, key_schema: pa.Schema) -> None:
        from headrace.spark.types import arrow_to_spark_schema

        self._handle = handle
        self._to_spark = arrow_to_spark_schema
        # declarations are checked by headrace's own rules (same errors on both engines)
        self._rules = StatefulProcessorHandle(time_mode, key_schema)
        self._time_mode = time_mode

    def get_value_state(self, name: str, schema: Any, ttl: Any = None, *, ttl_duration_ms: int | None = None
                        ) -> _SparkValue:  # fmt: skip
        """Declare a value state variable (Spark's ``getValueState``)."""
        what = f"value state {name!r}"
        s, t = parse_state_schema(schema, what), parse_ttl(ttl if ttl is not None else ttl_duration_ms, what)
        self._rules._declare(_HrValue(self._rules, name, s, t))
        return _SparkValue(self._handle.getValueState(name, self._to_spark(s), t), name, s)

    def get_list_state(self, name: str, schema: Any, ttl: Any = None, *, ttl_duration_ms: int | None = None
                       ) -> _SparkList:  # fmt: skip
        """Declare a list state variable (Spark's ``getListState``)."""
        what = f"list state {name!r}"
        s, t = parse_state_schema(schema, what), parse_ttl(ttl if ttl is not None else ttl_duration_ms, what)
        self._rules._declare(_HrList(self._rules, name, s, t))
        return _SparkList(self._handle.getListState(name, self._to_spark(s), t), name, s)

    def get_map_state(self, name: str, user_key_schema: Any, value_schema: Any, ttl: Any = None, *,
                      ttl_duration_ms: int | None = None) -> _SparkMap:  # fmt: skip
        """Declare a map state variable (Spark's ``getMapState``)."""
        what = f"map state {name!r}"
        t = parse_ttl(ttl if ttl is not None else ttl_duration_ms, what)
        ks, vs = parse_state_schema(user_key_schema, what + " key"), parse_state_schema(value_schema, what)
        self._rules._declare(_HrMap(self._rules, name, ks, vs, t))
        state = self._handle.getMapState(name, self._to_spark(ks), self._to_spark(vs), t)
        return _SparkMap(state, name, ks, vs)

    def delete_if_exists(self, name: str) -> None:
        """Spark's ``deleteIfExists``."""
        self._handle.deleteIfExists(name)

    def _check_timers(self, what: str) -> None:
        self._rules._key = ()  # the implicit key is Spark's; only the time mode is checked here
        try:
            self._rules._check_timers(what)
        finally:
            self._rules._key = None

    def register_timer(self, expiry_timestamp_ms: int) -> None:
        """Register a timer for the current key (Spark's ``registerTimer``)."""
        self._check_timers("register_timer")
        self._handle.registerTimer(timer_timestamp(expiry_timestamp_ms, "register_timer"))

    def delete_timer(self, expiry_timestamp_ms: int) -> None:
        """Delete the current key's timer (Spark's ``deleteTimer``)."""
        self._check_timers("delete_timer")
        self._handle.deleteTimer(int(expiry_timestamp_ms))

    def list_timers(self) -> Iterator[int]:
        """The current key's timers, earliest first."""
        self._check_timers("list_timers")
        return iter(sorted(int(t) for t in self._handle.listTimers()))

    getValueState = get_value_state
    getListState = get_list_state
    getMapState = get_map_state
    registerTimer = register_timer
    deleteTimer = delete_timer
    listTimers = list_timers
    deleteIfExists = delete_if_exists


class _Declarations:
    """pyspark's handle as far as a processor's ``init`` uses it, keeping nothing: lets the
    driver run ``init`` on a copy of the processor to check its declarations before the query
    starts (Spark runs ``init`` on the driver too, when the query plans its first batch)."""

    def getValueState(self, *args: Any, **kwargs: Any) -> None:
        return None

    getListState = getValueState
    getMapState = getValueState
    deleteIfExists = getValueState
    registerTimer = getValueState
    deleteTimer = getValueState

    def listTimers(self) -> Iterator[int]:
        return iter(())


def check_declarations(processor: StatefulProcessor, time_mode: str, key_schema: pa.Schema) -> None:
    """Run ``init`` on a copy of ``processor`` (a pickle round trip, as Spark ships it) with a
    handle that keeps nothing: raises the declaration errors (names, duplicates, a TTL that
    Spark refuses in this time mode) on the calling thread, before any Spark call. Called once
    per translation."""
    from pyspark import cloudpickle

    probe = cloudpickle.loads(cloudpickle.dumps(processor))
    handle = SparkStateHandle(_Declarations(), time_mode, key_schema)
    probe.handle = handle
    try:
        probe.init(handle)
    finally:
        probe.close()


class _OutputTarget:
    """What headrace's output collector needs of its operator: the processor and the schema."""

    def __init__(self, processor: StatefulProcessor, out_schema: pa.Schema) -> None:
        self.processor = processor
        self.out_schema = out_schema


def _to_arrow(frames: Iterable[pd.DataFrame], schema: pa.Schema, time_zone: str) -> pa.Table:
    """Spark's pandas frames of one key as one table of ``schema``: nulls back from NaN,
    naive timestamps (Spark's session-local wall time) back to instants."""
    import pyarrow.compute as pc

    tables = [pa.Table.from_pandas(f, preserve_index=False) for f in frames if len(f.columns)]
    if not tables:
        return schema.empty_table()
    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    cols = []
    for field in schema:
        col = (
            table.column(field.name)
            if field.name in table.column_names
            else pa.nulls(table.num_rows, field.type)
        )
        if pa.types.is_timestamp(field.type) and pa.types.is_timestamp(col.type) and col.type.tz is None:
            col = pc.assume_timezone(col, time_zone) if field.type.tz is not None else col
        if pa.types.is_integer(field.type) and pa.types.is_floating(col.type):
            col = pc.if_else(pc.is_nan(col), pa.scalar(None, col.type), col)
        cols.append(col.cast(field.type))
    return pa.Table.from_arrays(cols, schema=schema)


class SparkStatefulProcessor(_PySparkProcessor):
    """A pyspark ``StatefulProcessor`` running a headrace one (see the module's docstring).
    Built on the driver when the query is translated; pickled by Spark with the processor."""

    def __init__(self, processor: StatefulProcessor, *, keys: list[str], input_schema: pa.Schema,
                 output_schema: pa.Schema, time_mode: str, time_zone: str = "UTC",
                 initial_schema: pa.Schema | None = None) -> None:  # fmt: skip
        self.processor = processor
        self.keys = list(keys)
        self.input_schema = input_schema
        self.output_schema = output_schema
        self.time_mode = time_mode
        self.time_zone = time_zone
        self.initial_schema = initial_schema
        self._key_schema = pa.schema([input_schema.field(k) for k in keys])

    def init(self, handle: Any) -> None:
        """Spark calls it once on the driver and once per task: headrace's ``init`` with a
        :class:`SparkStateHandle`."""
        hr_handle = SparkStateHandle(handle, self.time_mode, self._key_schema)
        self.processor.handle = hr_handle  # type: ignore[assignment]
        self.processor.init(hr_handle)  # type: ignore[arg-type]

    def _emit(self, result: Iterable[Any] | None, method: str) -> Iterator[pd.DataFrame]:
        from headrace.transforms.transform_with_state import _Output

        out = _Output(_OutputTarget(self.processor, self.output_schema))  # type: ignore[arg-type]
        out.add(result, method)
        table = out.table()
        if table is not None and table.num_rows:
            yield table.to_pandas()

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
    ) -> Iterator[pd.DataFrame]:
        """Per key with rows in the batch: headrace's ``handle_input_rows`` with a table."""
        table = _to_arrow(rows, self.input_schema, self.time_zone)
        yield from self._emit(
            self.processor.handle_input_rows(_tuple(key) or (), table, _timer_values(timerValues)),
            "handle_input_rows",
        )

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """Per fired timer: headrace's ``handle_expired_timer``."""
        info = ExpiredTimerInfo(int(expiredTimerInfo.getExpiryTimeInMs()))
        yield from self._emit(
            self.processor.handle_expired_timer(_tuple(key) or (), _timer_values(timerValues), info),
            "handle_expired_timer",
        )

    def handleInitialState(self, key: Any, initialState: pd.DataFrame, timerValues: Any) -> None:
        """First batch, per key of the initial state: headrace's ``handle_initial_state``."""
        schema = self.initial_schema or pa.Schema.from_pandas(initialState, preserve_index=False)
        table = _to_arrow([initialState], schema, self.time_zone)
        self.processor.handle_initial_state(_tuple(key) or (), table, _timer_values(timerValues))

    def close(self) -> None:
        """Spark calls it when a task's partition is done (and after the driver's ``init``)."""
        self.processor.close()


def _timer_values(tv: Any) -> TimerValues:
    return TimerValues(int(tv.getCurrentProcessingTimeInMs()), int(tv.getCurrentWatermarkInMs()))

"""The transform_with_state adapter's own parts that need no Spark query: the conversion of
Spark's pandas frames back to the stream's Arrow schema, and the check of a processor's
declarations on the driver before start."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import HeadraceError, UnsupportedError
from headrace.spark.stateful import _to_arrow, check_declarations

pd = pytest.importorskip("pandas")

SCHEMA = pa.schema([("k", pa.string()), ("n", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
KEYS = pa.schema([("k", pa.string())])


def test_frames_become_one_table_of_the_stream_schema() -> None:
    """Integers with nulls come from Spark as floats with NaN, timestamps as the session's
    naive wall time: both are turned back (nulls, UTC instants)."""
    frames = [
        pd.DataFrame({"k": ["a"], "n": [1.0], "ts": [pd.Timestamp("2026-01-01 09:00:00")]}),
        pd.DataFrame({"k": ["a"], "n": [float("nan")], "ts": [pd.Timestamp("2026-07-01 09:00:00")]}),
    ]
    table = _to_arrow(frames, SCHEMA, "America/New_York")
    assert table.schema == SCHEMA
    assert table.column("n").to_pylist() == [1, None]
    assert table.column("ts").to_pylist() == [dt.datetime(2026, 1, 1, 14, tzinfo=dt.UTC),
                                              dt.datetime(2026, 7, 1, 13, tzinfo=dt.UTC)]  # fmt: skip


def test_no_frames_give_an_empty_table() -> None:
    assert _to_arrow([], SCHEMA, "UTC") == SCHEMA.empty_table()


class _Declares(hr.StatefulProcessor):
    def __init__(self, *declarations: tuple[str, str, Any]) -> None:
        self.declarations = declarations
        self.inits = 0

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.inits += 1
        for kind, name, ttl in self.declarations:
            if kind == "value":
                handle.get_value_state(name, "c BIGINT", ttl=ttl)
            elif kind == "list":
                handle.get_list_state(name, "c BIGINT", ttl=ttl)
            else:
                handle.get_map_state(name, "u STRING", "c BIGINT", ttl=ttl)

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Any:
        return ()


def test_valid_declarations_pass_and_the_processor_is_left_alone() -> None:
    proc = _Declares(("value", "count", None), ("list", "seen", "1 hour"), ("map", "last", 60_000))
    check_declarations(proc, "processing_time", KEYS)
    assert proc.inits == 0 and not hasattr(proc, "handle")  # init ran on a copy


@pytest.mark.parametrize(
    ("time_mode", "declarations", "error", "message"),
    [
        ("none", [("value", "count", None), ("list", "count", None)], HeadraceError, "declared twice"),
        ("none", [("value", "bad name", None)], HeadraceError, "state variable name 'bad name'"),
        ("none", [("map", "m", "1 hour")], UnsupportedError, "a TTL needs time_mode 'processing_time'"),
        ("event_time", [("value", "count", "1 hour")], UnsupportedError,
         "a TTL needs time_mode 'processing_time', and time_mode is 'event_time'"),
    ],
    ids=["duplicate-name", "bad-name", "ttl-without-time-mode", "ttl-in-event-time"],
)  # fmt: skip
def test_declarations_spark_would_refuse_are_refused(time_mode: str, declarations: list[Any], error: type,
                                                     message: str) -> None:  # fmt: skip
    with pytest.raises(error, match=message):
        check_declarations(_Declares(*declarations), time_mode, KEYS)

"""Test-only connectors, registered with Spark by ``ConnectorSpec`` (not installed as plugins).

- ``test-types``: one batch of rows covering every Arrow type plugins produce (``kind=all``), or
  one column of a type Spark cannot hold (``kind=union`` / ``kind=interval``).
- ``test-record``: an exactly-once sink that also logs every ``commit`` call (query id, batch
  id, rows) so tests can see what Spark drove.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from headrace.options import Choice, Option, OptionSchema, String
from headrace.plugins import ConnectorSpec
from headrace.protocols import CommitMessage, Offset, Partition, ReadLimit, Sink, Source

UTC = dt.UTC
PARIS = dt.timezone(dt.timedelta(hours=2))


def types_table() -> pa.Table:
    """Two rows of every type, the second mostly null."""
    d = decimal.Decimal
    cols: dict[str, pa.Array] = {
        "i8": pa.array([-8, None], pa.int8()),
        "i16": pa.array([-16, None], pa.int16()),
        "i32": pa.array([-32, None], pa.int32()),
        "i64": pa.array([-64, None], pa.int64()),
        "u8": pa.array([255, None], pa.uint8()),
        "u32": pa.array([4_294_967_295, None], pa.uint32()),
        "u64": pa.array([18_446_744_073_709_551_615, None], pa.uint64()),
        "f16": pa.array([1.5, None], pa.float32()).cast(pa.float16()),
        "f32": pa.array([2.5, None], pa.float32()),
        "f64": pa.array([3.25, None], pa.float64()),
        "dec": pa.array([d("12345.67"), None], pa.decimal128(10, 2)),
        "dec256": pa.array([d("1.5"), None], pa.decimal256(20, 1)),
        "s": pa.array(["a", None], pa.string()),
        "ls": pa.array(["large", None], pa.large_string()),
        "sv": pa.array(["view", None], pa.string_view()),
        "b": pa.array([b"\x00\x01", None], pa.binary()),
        "lb": pa.array([b"large", None], pa.large_binary()),
        "fsb": pa.array([b"abcd", None], pa.binary(4)),
        "bool": pa.array([True, None], pa.bool_()),
        "d32": pa.array([dt.date(2024, 5, 1), None], pa.date32()),
        "d64": pa.array([dt.date(2024, 5, 2), None], pa.date64()),
        "ts_ns_tz": pa.array([dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=PARIS), None], pa.timestamp("ns", tz="+02:00")),
        "ts_ms_utc": pa.array([dt.datetime(2024, 5, 1, 12, 0, 1, tzinfo=UTC), None], pa.timestamp("ms", tz="UTC")),
        "ts_ntz": pa.array([dt.datetime(2024, 5, 1, 12, 0, 2), None], pa.timestamp("us")),
        "dur": pa.array([dt.timedelta(seconds=90, microseconds=5), None], pa.duration("ns")),
        "lst": pa.array([[1, None, 3], None], pa.list_(pa.int32())),
        "llst": pa.array([["x"], None], pa.large_list(pa.large_string())),
        "fsl": pa.array([[1.0, 2.0], None], pa.list_(pa.float64(), 2)),
        "mp": pa.array([[("k", 1)], None], pa.map_(pa.string(), pa.int64())),
        "st": pa.array([{"x": 1, "y": "z", "t": dt.datetime(2024, 1, 1, tzinfo=UTC)}, None],
                       pa.struct([("x", pa.int16()), ("y", pa.large_string()), ("t", pa.timestamp("ns", tz="UTC"))])),
        "dict": pa.array(["red", None]).dictionary_encode(),
        "nul": pa.nulls(2),
    }  # fmt: skip
    return pa.table(cols)


def bad_table(kind: str) -> pa.Table:
    if kind == "union":
        arr = pa.UnionArray.from_sparse(pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["a", "b"])])
        return pa.table({"id": [1, 2], "u": arr})
    return pa.table({"id": [1, 2], "iv": pa.array([pa.MonthDayNano([1, 2, 3]), None], pa.month_day_nano_interval())})


@dataclass(frozen=True)
class _All(Partition):
    kind: str


class TypesSource(Source):
    """Offsets ``{"n": 0}`` -> ``{"n": 1}``: one batch; replayable; no native availableNow."""

    @property
    def schema(self) -> pa.Schema:
        kind = self.options["kind"]
        return (types_table() if kind == "all" else bad_table(kind)).schema

    def initial_offset(self) -> Offset:
        return {"n": 0}

    def latest_offset(self, start: Offset, limit: ReadLimit) -> Offset:
        return {"n": 1}

    def partitions(self, start: Offset, end: Offset) -> Sequence[Partition]:
        return [_All(self.options["kind"])] if start != end else []

    def read(self, partition: Partition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _All)
        yield from (types_table() if partition.kind == "all" else bad_table(partition.kind)).to_batches()


@dataclass(frozen=True)
class _Staged(CommitMessage):
    file: str
    rows: int


class RecordSink(Sink):
    """Stages each write as a Parquet file; ``commit`` publishes the batch's files once (a
    marker per batch id) and logs every call in ``<path>/_calls/`` as JSON."""

    idempotent_commit = True

    def __init__(self, options, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(options, context)
        self.path = str(options["path"])

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage:
        table = pa.Table.from_batches(list(data), schema=self.context.schema)
        os.makedirs(os.path.join(self.path, "_staging"), exist_ok=True)
        file = os.path.join(self.path, "_staging", f"{batch_id}-{uuid.uuid4().hex}.parquet")
        pq.write_table(table, file)
        return _Staged(file, table.num_rows)

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        staged = [m for m in messages if isinstance(m, _Staged)]
        os.makedirs(os.path.join(self.path, "_calls"), exist_ok=True)
        call = {"queryId": self.context.query_id, "batchId": batch_id, "rows": sum(m.rows for m in staged),
                "messages": len(messages), "statePath": self.context.state_path}  # fmt: skip
        with open(os.path.join(self.path, "_calls", f"{batch_id}-{uuid.uuid4().hex}.json"), "w") as f:
            json.dump(call, f)
        marker = os.path.join(self.path, f"_committed_{batch_id}")
        if os.path.exists(marker):
            return
        for m in staged:
            os.replace(m.file, os.path.join(self.path, f"part-{batch_id}-{os.path.basename(m.file)}"))
        open(marker, "w").close()


TYPES_SPEC = ConnectorSpec(
    name="test-types",
    source="tests.spark._connectors:TypesSource",
    source_options=OptionSchema([Option("kind", Choice("all", "union", "interval"), default="all")]),
)
RECORD_SPEC = ConnectorSpec(
    name="test-record",
    sink="tests.spark._connectors:RecordSink",
    sink_options=OptionSchema([Option("path", String(), required=True)]),
)


def calls(path: str) -> list[dict[str, Any]]:
    """The commit calls ``RecordSink`` logged under ``path``, by batch id."""
    folder = os.path.join(path, "_calls")
    if not os.path.isdir(folder):
        return []
    out = []
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            out.append(json.load(f))
    return sorted(out, key=lambda c: int(c["batchId"]))


def committed(path: str) -> pa.Table:
    """The rows ``RecordSink`` published under ``path``."""
    files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.startswith("part-"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else pa.table({})

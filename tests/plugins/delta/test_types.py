"""Delta types written by Spark: INT96 timestamps outside the nanosecond range (read at
microseconds, as Spark does) and the ``variant`` type (read as the struct of its ``metadata``
and ``value`` binaries). The data files are real Spark output (tests/plugins/delta/data) or
written by pyarrow the way Spark does; the Delta log is written by hand."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import headrace as hr
from headrace_delta._schema import VARIANT

DATA = Path(__file__).with_name("data")
UTC = dt.UTC


def delta_table(folder: Path, files: list[Path], fields: list[dict[str, Any]], features: tuple[str, ...] = ()) -> str:
    """A Delta table at ``folder`` whose version 0 adds ``files`` (copied in) with schema ``fields``."""
    log = folder / "_delta_log"
    log.mkdir(parents=True)
    protocol: dict[str, Any] = {"minReaderVersion": 1, "minWriterVersion": 2}
    if features:
        protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": list(features),
                    "writerFeatures": list(features)}  # fmt: skip
    actions: list[dict[str, Any]] = [
        {"protocol": protocol},
        {"metaData": {"id": "5c5d1a8e-0000-4000-8000-000000000001", "format": {"provider": "parquet", "options": {}},
                      "schemaString": json.dumps({"type": "struct", "fields": fields}), "partitionColumns": [],
                      "configuration": {}, "createdTime": 1_700_000_000_000}},
    ]  # fmt: skip
    for i, f in enumerate(files):
        name = f"part-{i:05d}.parquet"
        shutil.copy(f, folder / name)
        actions.append({"add": {"path": name, "partitionValues": {}, "size": os.path.getsize(folder / name),
                                "modificationTime": 1_700_000_000_000, "dataChange": True}})  # fmt: skip
    actions.append({"commitInfo": {"timestamp": 1_700_000_000_000, "operation": "WRITE"}})
    (log / f"{0:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    return str(folder)


def stream(path: str, chk: Path) -> pa.Table:
    name = f"types_{abs(hash(path))}"
    q = (hr.read_stream.format("delta").load(path).write_stream.format("memory").query_name(name)
         .option("checkpointLocation", str(chk)).trigger(available_now=True).start())  # fmt: skip
    q.await_termination(60)
    assert q.exception() is None, q.exception()
    return hr.memory_table(name).sort_by("id")


EXTREMES = [
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    dt.datetime(1500, 1, 1, tzinfo=UTC),
    dt.datetime(1677, 9, 21, 0, 12, 43, 145224, tzinfo=UTC),  # just before the int64-nanosecond range
    dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
    None,
]
TS_FIELDS = [{"name": "id", "type": "integer", "nullable": False, "metadata": {}},
             {"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}}]  # fmt: skip


def test_int96_timestamps_outside_the_nanosecond_range(tmp_path: Path) -> None:
    data = pa.table({"id": pa.array(range(len(EXTREMES)), pa.int32()),
                     "ts": pa.array(EXTREMES, pa.timestamp("us", tz="UTC"))})  # fmt: skip
    pq.write_table(data, tmp_path / "f.parquet", use_deprecated_int96_timestamps=True)
    assert pq.ParquetFile(tmp_path / "f.parquet").schema.column(1).physical_type == "INT96"
    out = stream(delta_table(tmp_path / "t", [tmp_path / "f.parquet"], TS_FIELDS), tmp_path / "chk")
    assert out.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert out.column("ts").to_pylist() == EXTREMES


def test_int96_timestamps_written_by_spark(tmp_path: Path) -> None:
    out = stream(delta_table(tmp_path / "t", [DATA / "spark_int96.parquet"], TS_FIELDS), tmp_path / "chk")
    assert out.column("ts").to_pylist() == [
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1500, 1, 1, tzinfo=UTC),
        dt.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC),
        None,
    ]


@pytest.mark.parametrize("feature", ["variantType", "variantType-preview"])
def test_variant_written_by_spark_is_read_as_metadata_and_value(tmp_path: Path, feature: str) -> None:
    fields = [{"name": "id", "type": "integer", "nullable": False, "metadata": {}},
              {"name": "v", "type": "variant", "nullable": True, "metadata": {}}]  # fmt: skip
    path = delta_table(tmp_path / "t", [DATA / "spark_variant.parquet"], fields, features=(feature,))
    out = stream(path, tmp_path / "chk")
    assert out.schema.field("v").type == VARIANT
    rows = out.column("v").to_pylist()
    # the Variant binary encoding: metadata = version 1 + dictionary of keys, value = header + data
    assert rows[0] is not None and rows[0]["metadata"] == b"\x01\x02\x00\x01\x02ab"
    assert rows[0]["value"].endswith(b"x")
    assert rows[1] == {"metadata": b"\x01\x00\x00", "value": b"\x0c*"}  # the integer 42
    assert rows[2] is None


def test_variant_inside_a_struct(tmp_path: Path) -> None:
    inner = pq.read_table(DATA / "spark_variant.parquet")
    nested = pa.table({"id": inner.column("id"),
                       "s": pa.StructArray.from_arrays([inner.column("v").combine_chunks()], names=["v"])})  # fmt: skip
    pq.write_table(nested, tmp_path / "f.parquet")
    fields = [{"name": "id", "type": "integer", "nullable": False, "metadata": {}},
              {"name": "s", "type": {"type": "struct", "fields": [{"name": "v", "type": "variant", "nullable": True,
                                                                    "metadata": {}}]},
               "nullable": True, "metadata": {}}]  # fmt: skip
    out = stream(delta_table(tmp_path / "t", [tmp_path / "f.parquet"], fields, features=("variantType",)), tmp_path / "chk")
    assert out.schema.field("s").type == pa.struct([pa.field("v", VARIANT)])
    assert out.column("s").to_pylist()[1] == {"v": {"metadata": b"\x01\x00\x00", "value": b"\x0c*"}}

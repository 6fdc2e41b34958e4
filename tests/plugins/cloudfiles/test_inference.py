"""Schema inference reads a bounded prefix of each sampled file (json lines, csv, avro), only the
footer of parquet files, and a bounded number of bytes overall; columns that first appear past
the prefix are then found by schema evolution, or rescued."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headrace.errors import SchemaChangedError, StreamingQueryException
from headrace_cloudfiles.formats import ReaderConfig, infer_data_schema, read_prefix
from headrace_cloudfiles.local import LocalStore
from tests.plugins.cloudfiles.helpers import output, run, write_json

ROWS = 400  # ~ 20 KB of json lines per file: far past a 1 KB prefix


def opts(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.schemaLocation": str(tmp_path / "schema"),
            "cloudFiles.schemaInference.bytesPerFile": "1k", **more}  # fmt: skip


def stored(tmp_path: Path, version: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((tmp_path / "schema" / "_schemas" / str(version)).read_text())
    return doc


def late_rows() -> list[dict[str, Any]]:
    """``id``/``name`` throughout; ``late`` only in the last row, far past the prefix."""
    rows: list[dict[str, Any]] = [{"id": i, "name": f"user-{i:04d}"} for i in range(ROWS)]
    rows[-1]["late"] = 2.5
    return rows


def test_read_prefix_cuts_at_a_line_end(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path))
    (tmp_path / "a.json").write_bytes(b"".join(b'{"i": %d}\n' % i for i in range(100)))  # 9-10 bytes a line
    data, whole = read_prefix(store, "a.json", 64)
    assert not whole and data.endswith(b"\n") and len(data) <= 64
    assert [json.loads(x)["i"] for x in data.splitlines()] == list(range(len(data.splitlines())))
    assert read_prefix(store, "a.json", 10_000) == ((tmp_path / "a.json").read_bytes(), True)
    # a file of exactly the prefix size is whole, even without a final line end
    (tmp_path / "b.json").write_bytes(b'{"i": 1}\n{"i": 2}')
    assert read_prefix(store, "b.json", 17) == (b'{"i": 1}\n{"i": 2}', True)
    # a first line longer than the prefix is read to its end; \r\n and \r count as line ends
    (tmp_path / "c.json").write_bytes(b'{"s": "' + b"x" * 300 + b'"}\r\n{"i": 2}\r\n' * 5)
    data, whole = read_prefix(store, "c.json", 64)
    assert not whole and data.startswith(b'{"s"') and data.count(b"\n") + data.count(b"\r") == 1
    # compressed files: the prefix is of the decompressed text
    (tmp_path / "d.json.gz").write_bytes(gzip.compress(b"".join(b'{"i": %d}\n' % i for i in range(1000))))
    data, whole = read_prefix(store, "d.json.gz", 100)
    assert not whole and data.startswith(b'{"i": 0}\n') and data.endswith(b"\n")


def test_late_column_is_not_inferred_then_added_by_schema_evolution(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    write_json(src, "a.json", late_rows())
    with pytest.raises(StreamingQueryException) as e:
        run(src, out, chk, **opts(tmp_path))
    assert stored(tmp_path, 0)["ddl"] == "`id` BIGINT, `name` STRING"  # the prefix has no 'late'
    assert isinstance(e.value.cause, SchemaChangedError) and "'late'" in str(e.value) and "a.json" in str(e.value)
    assert stored(tmp_path, 1)["ddl"] == "`id` BIGINT, `name` STRING, `late` DOUBLE"
    run(src, out, chk, **opts(tmp_path))  # the restart reads the file again with the column
    t = output(out)
    assert t.num_rows == ROWS and sorted(t.column("id").to_pylist()) == list(range(ROWS))
    assert [v for v in t.column("late").to_pylist() if v is not None] == [2.5]


def test_late_column_is_rescued_in_rescue_mode(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    write_json(src, "a.json", late_rows())
    run(src, out, chk, **opts(tmp_path, **{"cloudFiles.schemaEvolutionMode": "rescue"}))
    t = output(out)
    assert t.column_names == ["id", "name", "_rescued_data"] and t.num_rows == ROWS
    rescued = [json.loads(r) for r in t.column("_rescued_data").to_pylist() if r]
    assert len(rescued) == 1 and rescued[0]["late"] == 2.5 and rescued[0]["_file_path"].endswith("a.json")


def test_whole_file_read_when_the_prefix_covers_it_and_types_widen_across_files(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_json(src, "a.json", [{"id": 1, "x": 1}] * 3)
    write_json(src, "b.json", [{"id": 2, "x": 1.5, "y": "s"}])  # x widens to double, y added
    store = LocalStore(str(src))
    files = [(f.rel, f.size, f.mtime_ms) for f in store.list()]
    schema = infer_data_schema(store, files, ReaderConfig("json", typed=True), ignore_corrupt=False, prefix_bytes=1024)
    assert schema == pa.schema([("id", pa.int64()), ("x", pa.float64()), ("y", pa.string())])
    # the same types as reading the files in full
    assert schema == infer_data_schema(store, files, ReaderConfig("json", typed=True), ignore_corrupt=False)


def test_csv_prefix_keeps_header_types_from_the_prefix_and_rescues_later_values(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    src.mkdir()
    lines = ["n,s"] + [f'{i},"text {i}"' for i in range(ROWS)] + ['oops,"multi\nline"']
    (src / "a.csv").write_text("\n".join(lines) + "\n")
    run(src, out, chk, **opts(tmp_path, **{"cloudFiles.format": "csv", "header": "true"}))
    assert stored(tmp_path)["ddl"] == "`n` BIGINT, `s` STRING"  # 'oops' is past the prefix
    t = output(out)
    assert t.num_rows == ROWS + 1 and t.column("s").to_pylist()[-1] == "multi\nline"
    assert json.loads(t.column("_rescued_data").to_pylist()[-1])["n"] == "oops"


def test_csv_prefix_cut_inside_a_quoted_value(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.csv").write_text('k,v\n1,"' + "line\n" * 400 + '"\n2,x\n')  # the cut falls inside v
    store = LocalStore(str(src))
    files = [(f.rel, f.size, f.mtime_ms) for f in store.list()]
    cfg = ReaderConfig("csv", typed=True, header=True)
    schema = infer_data_schema(store, files, cfg, ignore_corrupt=False, prefix_bytes=64)
    assert schema == pa.schema([("k", pa.int64()), ("v", pa.string())])


def test_parquet_schema_comes_from_the_footer_only(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    src.mkdir()
    n = 20_000
    pq.write_table(pa.table({"id": list(range(n)), "name": [f"n{i}" for i in range(n)]}), src / "a.parquet")
    data = bytearray((src / "a.parquet").read_bytes())
    data[8 : len(data) // 2] = b"\xff" * (len(data) // 2 - 8)  # data pages unreadable, footer intact
    (src / "a.parquet").write_bytes(bytes(data))
    more = {"cloudFiles.format": "parquet", "ignoreCorruptFiles": "true"}
    run(src, out, chk, **opts(tmp_path, **more))
    assert stored(tmp_path)["ddl"] == "`id` BIGINT, `name` STRING"  # inferred without reading the pages
    assert output(out).num_rows == 0  # reading the data itself fails (skipped: ignoreCorruptFiles)


def test_num_bytes_bounds_the_bytes_read_overall(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    for f in range(4):
        write_json(src, f"f{f}.json", [{"id": f, f"c{f}": f}] * ROWS)  # each file ~ 7 KB, 1 KB read
    run(src, out, chk, **opts(tmp_path, **{"cloudFiles.schemaEvolutionMode": "rescue",
                                           "cloudFiles.schemaInference.sampleSize.numBytes": "2k"}))  # fmt: skip
    doc = stored(tmp_path)
    assert doc["reason"] == "inferred from 2 file(s)" and doc["ddl"] == "`id` BIGINT, `c0` BIGINT, `c1` BIGINT"
    assert output(out).num_rows == 4 * ROWS


def test_avro_inference_reads_the_first_blocks(tmp_path: Path) -> None:
    fastavro = pytest.importorskip("fastavro")
    src = tmp_path / "in"
    src.mkdir()
    schema = {"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"},
                                                         {"name": "tag", "type": ["null", "string"]}]}  # fmt: skip
    with open(src / "a.avro", "wb") as f:
        fastavro.writer(f, schema, ({"id": i, "tag": f"t{i}"} for i in range(20_000)), sync_interval=1024)
    store = LocalStore(str(src))
    files = [(f.rel, f.size, f.mtime_ms) for f in store.list()]
    cfg = ReaderConfig("avro")
    prefixed = infer_data_schema(store, files, cfg, ignore_corrupt=False, prefix_bytes=2048)
    assert prefixed == infer_data_schema(store, files, cfg, ignore_corrupt=False)
    assert prefixed == pa.schema([("id", pa.int64()), ("tag", pa.string())])

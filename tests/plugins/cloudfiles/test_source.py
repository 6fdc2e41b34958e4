"""cloudFiles end to end on local folders: formats, limits, filters, discovery, metrics."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import headrace as hr
from headrace.errors import StreamingQueryException
from headrace.options import Options
from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext
from headrace.testing import wait_for
from tests.plugins.cloudfiles.helpers import output, run, write_json

#: reader options (values of several types); `run(..., **opts)` needs them typed so
Opts = dict[str, Any]
JSON: Opts = {"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true"}


def ids(table: pa.Table, col: str = "id") -> list[Any]:
    return sorted(table.column(col).to_pylist())


def test_json_files_ingested_exactly_once_across_restarts(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    for i in range(3):
        write_json(src, f"a{i}.json", [{"id": i * 10 + k, "name": f"n{k}"} for k in range(5)])
    opts: Opts = {**JSON, "cloudFiles.schemaLocation": str(tmp_path / "schema")}
    q = run(src, out, chk, **opts)
    assert q.last_progress is not None
    assert q.last_progress["numInputRows"] == 15
    write_json(src, "b0.json", [{"id": 100, "name": "late"}])
    write_json(src, "nested/deeper/b1.json", [{"id": 101, "name": "deep"}])
    q = run(src, out, chk, **opts)
    assert sum(p["numInputRows"] for p in q.recent_progress) == 2
    q = run(src, out, chk, **opts)  # nothing new: no batch
    assert q.recent_progress == []
    table = output(out)
    assert ids(table) == sorted([i * 10 + k for i in range(3) for k in range(5)] + [100, 101])
    assert table.schema.field("id").type == pa.int64()
    assert table.column("_rescued_data").null_count == table.num_rows


def test_max_files_per_trigger_splits_batches_and_reports_backlog(tmp_path: Path) -> None:
    src = tmp_path / "in"
    for i in range(7):
        write_json(src, f"f{i}.json", [{"id": i, "pad": "x" * 100}])
    q = run(src, tmp_path / "out", tmp_path / "chk", **JSON, **cast(Opts, {
        "cloudFiles.schemaLocation": str(tmp_path / "s"), "cloudFiles.maxFilesPerTrigger": 3}))  # fmt: skip
    progress = q.recent_progress
    assert [p["numInputRows"] for p in progress] == [3, 3, 1]
    metrics = [p["sources"][0]["metrics"] for p in progress]
    assert [m["numFilesOutstanding"] for m in metrics] == [4, 1, 0]
    one = (src / "f0.json").stat().st_size
    assert metrics[0]["numBytesOutstanding"] == 4 * one
    assert ids(output(tmp_path / "out")) == list(range(7))


def test_max_bytes_per_trigger_is_soft(tmp_path: Path) -> None:
    src = tmp_path / "in"
    for i in range(4):
        write_json(src, f"f{i}.json", [{"id": i, "pad": "y" * 200}])
    q = run(src, tmp_path / "out", tmp_path / "chk", **JSON, **cast(Opts, {
        "cloudFiles.schemaLocation": str(tmp_path / "s"), "cloudFiles.maxBytesPerTrigger": "10"}))  # fmt: skip
    assert [p["numInputRows"] for p in q.recent_progress] == [1, 1, 1, 1]  # at least one file per batch


def test_thousands_of_small_files_in_default_size_batches(tmp_path: Path) -> None:
    # 2,500 files: several batches of the default maxFilesPerTrigger (1000) and a partial one;
    # scale (200,000 files) is measured by bench/cloudfiles.py, not here
    n = 2_500
    src = tmp_path / "in"
    src.mkdir()
    for i in range(n):
        (src / f"f{i:05d}.json").write_text(json.dumps({"id": i}) + "\n")
    t0 = time.monotonic()
    q = run(src, tmp_path / "out", tmp_path / "chk", **JSON, **cast(Opts, {
        "cloudFiles.schemaLocation": str(tmp_path / "s")}))  # fmt: skip
    assert [p["numInputRows"] for p in q.recent_progress] == [1000, 1000, 500]
    table = output(tmp_path / "out")
    assert table.num_rows == n and len(set(table.column("id").to_pylist())) == n
    assert time.monotonic() - t0 < 30


def _csv_opts(tmp_path: Path) -> dict[str, Any]:
    return {"cloudFiles.format": "csv", "header": "true", "sep": ";", "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.schemaLocation": str(tmp_path / "s")}  # fmt: skip


def test_csv_header_delimiter_quote_and_malformed_rows(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.csv").write_text('id;name\n1;"semi;colon"\n2;"say ""hi"""\n3;\n4;x;extra\n')
    run(src, tmp_path / "out", tmp_path / "chk", **_csv_opts(tmp_path))
    rows = sorted(output(tmp_path / "out").to_pylist(), key=lambda r: (r["id"] is None, r["id"]))
    assert [r["id"] for r in rows] == [1, 2, 3, None]
    assert rows[0]["name"] == "semi;colon" and rows[1]["name"] == 'say "hi"' and rows[2]["name"] is None
    rescued = json.loads(rows[3]["_rescued_data"])
    assert rescued["_malformed_record"] == "4;x;extra" and rescued["_file_path"].endswith("a.csv")


def test_csv_without_header_and_without_type_inference(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.csv").write_text("1,a\n2,b\n")
    run(src, tmp_path / "out", tmp_path / "chk", **cast(Opts, {
        "cloudFiles.format": "csv", "cloudFiles.schemaLocation": str(tmp_path / "s")}))  # fmt: skip
    table = output(tmp_path / "out")
    assert table.column_names == ["_c0", "_c1", "_rescued_data"]
    assert table.schema.field("_c0").type == pa.string() and sorted(table.column("_c0").to_pylist()) == ["1", "2"]


def test_json_without_type_inference_gives_strings(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_json(src, "a.json", [{"id": 1, "ok": True, "obj": {"k": [1, 2]}}])
    run(src, tmp_path / "out", tmp_path / "chk", **cast(Opts, {
        "cloudFiles.format": "json", "cloudFiles.schemaLocation": str(tmp_path / "s")}))  # fmt: skip
    row = output(tmp_path / "out").to_pylist()[0]
    assert row["id"] == "1" and row["ok"] == "true" and json.loads(row["obj"]) == {"k": [1, 2]}


def test_parquet_text_binary_avro_and_gzip(tmp_path: Path) -> None:
    import fastavro

    pq_dir, txt_dir, bin_dir, avro_dir, gz_dir = (tmp_path / n for n in ("pq", "txt", "bin", "avro", "gz"))
    for d in (pq_dir, txt_dir, bin_dir, avro_dir, gz_dir):
        d.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "v": [0.5, 1.5]}), pq_dir / "a.parquet")
    (txt_dir / "a.txt").write_text("first line\nsecond line\r\nthird\n")
    (bin_dir / "blob.bin").write_bytes(b"\x00\x01binary")
    schema = {"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"}, {"name": "s", "type": "string"}]}
    with open(avro_dir / "a.avro", "wb") as f:
        fastavro.writer(f, schema, [{"id": 1, "s": "x"}, {"id": 2, "s": "y"}])
    with gzip.open(gz_dir / "a.json.gz", "wt") as f:
        f.write('{"id": 7}\n{"id": 8}\n')

    run(pq_dir, tmp_path / "o1", tmp_path / "c1", **cast(Opts, {
        "cloudFiles.format": "parquet", "cloudFiles.schemaLocation": str(tmp_path / "s1")}))  # fmt: skip
    t = output(tmp_path / "o1")
    assert t.schema.field("v").type == pa.float64() and ids(t) == [1, 2]

    run(txt_dir, tmp_path / "o2", tmp_path / "c2", **cast(Opts, {"cloudFiles.format": "text"}))
    assert output(tmp_path / "o2").column("value").to_pylist() == ["first line", "second line", "third"]

    run(bin_dir, tmp_path / "o3", tmp_path / "c3", **cast(Opts, {"cloudFiles.format": "binaryFile"}))
    row = output(tmp_path / "o3").to_pylist()[0]
    assert row["content"] == b"\x00\x01binary" and row["length"] == 8 and row["path"].endswith("blob.bin")
    assert isinstance(row["modificationTime"], dt.datetime)

    run(avro_dir, tmp_path / "o4", tmp_path / "c4", **cast(Opts, {
        "cloudFiles.format": "avro", "cloudFiles.schemaLocation": str(tmp_path / "s4")}))  # fmt: skip
    assert output(tmp_path / "o4").select(["id", "s"]).to_pylist() == [{"id": 1, "s": "x"}, {"id": 2, "s": "y"}]

    run(gz_dir, tmp_path / "o5", tmp_path / "c5", **JSON, **cast(Opts, {
        "cloudFiles.schemaLocation": str(tmp_path / "s5")}))  # fmt: skip
    assert ids(output(tmp_path / "o5")) == [7, 8]


def test_schema_hints_and_partition_columns(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_json(src, "date=2024-01-01/region=eu/a.json", [{"id": 1}])
    write_json(src, "date=2024-01-02/region=us/b.json", [{"id": 2}])
    run(src, tmp_path / "out", tmp_path / "chk", **JSON, **cast(Opts, {
        "cloudFiles.schemaLocation": str(tmp_path / "s"), "cloudFiles.schemaHints": "id INT, date DATE"}))  # fmt: skip
    t = output(tmp_path / "out")
    assert t.column_names == ["id", "date", "region", "_rescued_data"]
    assert t.schema.field("id").type == pa.int32() and t.schema.field("date").type == pa.date32()
    assert sorted(t.select(["date", "region"]).to_pylist(), key=str) == [
        {"date": dt.date(2024, 1, 1), "region": "eu"}, {"date": dt.date(2024, 1, 2), "region": "us"}]


def test_explicit_partition_columns_and_user_schema(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_json(src, "k=a/x=1/f.json", [{"id": 1, "other": "dropped"}])
    run(src, tmp_path / "out", tmp_path / "chk", schema="id BIGINT", **cast(Opts, {
        "cloudFiles.format": "json", "cloudFiles.partitionColumns": "k"}))  # fmt: skip
    t = output(tmp_path / "out")
    assert t.to_pylist() == [{"id": 1, "k": "a"}]  # schemaEvolutionMode none: new columns ignored, no rescue


def test_glob_filter_hidden_files_and_modified_window(tmp_path: Path) -> None:
    src = tmp_path / "in"
    for name in ("a.json", "b.csv.json", "c.txt", "d.ndjson", "_tmp.json", ".hidden.json", "_staging/e.json"):
        write_json(src, name, [{"id": len(name)}])
    old = src / "a.json"
    os.utime(old, (time.time() - 86400 * 10, time.time() - 86400 * 10))
    run(src, tmp_path / "out", tmp_path / "chk", **JSON, **cast(Opts, {
        "cloudFiles.schemaLocation": str(tmp_path / "s"), "pathGlobFilter": "*.{json,ndjson}",
        "modifiedAfter": (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).isoformat()}))  # fmt: skip
    assert ids(output(tmp_path / "out")) == sorted([len("b.csv.json"), len("d.ndjson")])


def test_include_existing_files_false(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    write_json(src, "old.json", [{"id": 1}])
    opts: Opts = {**JSON, "cloudFiles.schemaLocation": str(tmp_path / "s"),
                  "cloudFiles.includeExistingFiles": "false"}  # fmt: skip
    q = run(src, out, chk, **opts)
    assert q.recent_progress == []
    write_json(src, "new.json", [{"id": 2}])
    run(src, out, chk, **opts)
    assert ids(output(out)) == [2]


@pytest.mark.parametrize("allow", [False, True], ids=["overwrites-ignored", "overwrites-reingested"])
def test_allow_overwrites(tmp_path: Path, allow: bool) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    f = write_json(src, "a.json", [{"id": 1}])
    opts: Opts = {**JSON, "cloudFiles.schemaLocation": str(tmp_path / "s"),
                  "cloudFiles.allowOverwrites": str(allow)}  # fmt: skip
    run(src, out, chk, **opts)
    write_json(src, "a.json", [{"id": 2}, {"id": 3}])
    os.utime(f, (time.time() + 5, time.time() + 5))
    run(src, out, chk, **opts)
    assert ids(output(out)) == ([1, 2, 3] if allow else [1])


def _source(tmp_path: Path, **raw: Any) -> Any:
    spec = registry().get("cloudFiles")
    opts: Options = spec.source_options.parse({"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
                                               "cloudFiles.schemaLocation": str(tmp_path / "s"), **raw})  # fmt: skip
    (tmp_path / "state").mkdir(parents=True, exist_ok=True)
    return spec.load_source()(opts, SourceContext(state_path=str(tmp_path / "state")))


@pytest.mark.parametrize(
    ("mode", "found_at"),
    [("true", None), ("false", 1), ("auto", 1)],
    ids=["incremental-never-sees-it", "full-listing-sees-it-at-once", "auto-sees-it-while-still-full-listing"],
)
def test_incremental_listing_and_out_of_order_names(tmp_path: Path, mode: str, found_at: int | None) -> None:
    src = tmp_path / "in"
    write_json(src, "2024/05/b.json", [{"id": 1}])
    s = _source(tmp_path, path=str(src), **{"cloudFiles.useIncrementalListing": mode})
    try:
        end = s.latest_offset(s.initial_offset(), ReadLimit.all_available())
        assert end == {"seq": 1}
        write_json(src, "2024/04/a.json", [{"id": 0}])  # sorts before what was seen
        seen_at = None
        for k in range(1, 9):
            write_json(src, f"2024/06/z{k}.json", [{"id": 10 + k}])
            nxt = s.latest_offset(end, ReadLimit.all_available())
            rels = [f.rel for f in s.index.files(end["seq"], nxt["seq"])]
            end = nxt
            assert f"2024/06/z{k}.json" in rels
            if "2024/04/a.json" in rels:
                seen_at = k
        assert seen_at == found_at
        if mode == "auto":
            assert s.index.get("lexical") == "no"
    finally:
        s.close()


def test_auto_listing_turns_incremental_then_full_every_eighth(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_json(src, "a/000.json", [{"id": 0}])
    s = _source(tmp_path, path=str(src))
    try:
        end = s.latest_offset(s.initial_offset(), ReadLimit.all_available())
        write_json(src, "a/001.json", [{"id": 1}])
        end = s.latest_offset(end, ReadLimit.all_available())  # full listing: new names sort last
        assert s.index.get("lexical") == "yes"
        write_json(src, "0-early.json", [{"id": -1}])  # sorts first: only a full listing finds it
        found_at = None
        for k in range(2, 12):
            write_json(src, f"a/{k:03d}.json", [{"id": k}])
            nxt = s.latest_offset(end, ReadLimit.all_available())
            rels = [f.rel for f in s.index.files(end["seq"], nxt["seq"])]
            assert f"a/{k:03d}.json" in rels
            if "0-early.json" in rels:
                found_at = k - 1
            end = nxt
        assert found_at == 8  # 7 incremental listings, then a full one
    finally:
        s.close()


def test_missing_and_corrupt_files(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_json(src, "a.json", [{"id": 1}])
    write_json(src, "b.json", [{"id": 2}])
    s = _source(tmp_path, path=str(src))
    try:
        start = s.initial_offset()
        end = s.latest_offset(start, ReadLimit.all_available())
        _ = s.schema
        (src / "a.json").unlink()
        with pytest.raises(hr.HeadraceError, match=r"a\.json was listed but is gone now.*ignoreMissingFiles"):
            [b for p in s.partitions(start, end) for b in s.read(p)]
    finally:
        s.close()
    s = _source(tmp_path / "second", path=str(src), ignoreMissingFiles="true")
    try:
        start = s.initial_offset()
        end = s.latest_offset(start, ReadLimit.all_available())
        _ = s.schema
        (src / "b.json").unlink()
        assert sum(b.num_rows for p in s.partitions(start, end) for b in s.read(p)) == 0
    finally:
        s.close()

    pq_dir = tmp_path / "pq"
    pq_dir.mkdir()
    pq.write_table(pa.table({"id": [1]}), pq_dir / "good.parquet")
    opts: Opts = {"cloudFiles.format": "parquet", "cloudFiles.schemaLocation": str(tmp_path / "ps")}
    run(pq_dir, tmp_path / "o0", tmp_path / "c0", **opts)  # infers the schema from the good file
    (pq_dir / "zbad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(StreamingQueryException, match=r"zbad\.parquet.*ignoreCorruptFiles"):
        run(pq_dir, tmp_path / "o1", tmp_path / "c1", **opts)
    run(pq_dir, tmp_path / "o2", tmp_path / "c2", **opts, ignoreCorruptFiles="true")
    assert ids(output(tmp_path / "o2")) == [1]


def test_file_arriving_during_a_batch_is_read_by_a_later_batch(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_json(src, "a0.json", [{"id": 0}])
    added = threading.Event()

    def add_file_during_batch(t: pa.Table) -> pa.Table:
        if not added.is_set():
            write_json(src, "a1.json", [{"id": 1}])  # lands while batch 0 is being read
            added.set()
        return t

    q = (
        hr.read_stream.format("cloudFiles").options({**JSON, "cloudFiles.schemaLocation": str(tmp_path / "s")})
        .load(str(src)).map_batches(add_file_during_batch)
        .write_stream.format("memory").query_name("cf_during_batch").start()
    )  # fmt: skip
    try:
        wait_for(lambda: hr.memory_table("cf_during_batch").num_rows >= 2, what="the file added during batch 0")
        assert sorted(hr.memory_table("cf_during_batch").column("id").to_pylist()) == [0, 1]
        assert q.recent_progress[0]["numInputRows"] == 1
    finally:
        q.stop()
    assert q.exception() is None

"""Schema inference, stored versions and evolution in every schemaEvolutionMode, rescued data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.errors import SchemaChangedError, StreamingQueryException
from tests.plugins.cloudfiles.helpers import output, run, write_json


def opts(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.schemaLocation": str(tmp_path / "schema"), **more}  # fmt: skip


def versions(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "schema" / "_schemas").iterdir())


def test_add_new_columns_fails_once_then_restart_continues(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    write_json(src, "a.json", [{"id": 1}])
    run(src, out, chk, **opts(tmp_path))
    write_json(src, "b.json", [{"id": 2, "color": "red", "size": 3}])
    with pytest.raises(StreamingQueryException) as e:
        run(src, out, chk, **opts(tmp_path))
    assert isinstance(e.value.cause, SchemaChangedError)
    assert "'color', 'size'" in str(e.value) and "schema version 1" in str(e.value)
    assert versions(tmp_path) == ["0", "1"]
    stored = json.loads((tmp_path / "schema" / "_schemas" / "1").read_text())
    assert stored["ddl"] == "`id` BIGINT, `color` STRING, `size` BIGINT"
    run(src, out, chk, **opts(tmp_path))  # the restart replays the failed batch with the new columns
    rows = sorted(output(out).to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r.get("color"), r.get("size")) for r in rows] == [(1, None, None), (2, "red", 3)]


def test_rescue_mode_keeps_new_columns_as_json(tmp_path: Path) -> None:
    src, out = tmp_path / "in", tmp_path / "out"
    write_json(src, "a.json", [{"id": 1}])
    write_json(src, "b.json", [{"id": 2, "extra": {"deep": [1, 2]}}])
    run(src, out, tmp_path / "chk", **opts(tmp_path, **{"cloudFiles.schemaEvolutionMode": "rescue",
                                                          "cloudFiles.schemaHints": "id BIGINT"}))  # fmt: skip
    assert output(out).column("extra").to_pylist() == [None, {"deep": [1, 2]}]  # inferred from both files
    # a column that appears after the schema was inferred is rescued, not added
    write_json(src, "c.json", [{"id": 3, "later": True}])
    run(src, out, tmp_path / "chk", **opts(tmp_path, **{"cloudFiles.schemaEvolutionMode": "rescue"}))
    rows = {r["id"]: r for r in output(out).to_pylist()}
    rescued = json.loads(rows[3]["_rescued_data"])
    assert rescued["later"] is True and rescued["_file_path"].endswith("c.json")
    assert versions(tmp_path) == ["0"]


def test_fail_on_new_columns_until_the_schema_has_them(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    write_json(src, "a.json", [{"id": 1}])
    mode = {"cloudFiles.schemaEvolutionMode": "failOnNewColumns"}
    run(src, out, chk, **opts(tmp_path, **mode))
    write_json(src, "b.json", [{"id": 2, "color": "blue"}])
    for _ in range(2):  # fails again on restart: the stored schema is not changed
        with pytest.raises(StreamingQueryException, match="'color'.*failOnNewColumns.*schemaHints"):
            run(src, out, chk, **opts(tmp_path, **mode))
    assert versions(tmp_path) == ["0"]
    run(src, out, chk, **opts(tmp_path, **mode, **{"cloudFiles.schemaHints": "color STRING"}))
    assert sorted(output(out).column("color").to_pylist(), key=str) == [None, "blue"]


def test_none_mode_ignores_new_columns_without_rescue_column(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    write_json(src, "a.json", [{"id": 1}])
    mode = {"cloudFiles.schemaEvolutionMode": "none"}
    run(src, out, chk, **opts(tmp_path, **mode))
    write_json(src, "b.json", [{"id": 2, "color": "blue"}])
    run(src, out, chk, **opts(tmp_path, **mode))
    t = output(out)
    assert t.column_names == ["id"] and sorted(t.column("id").to_pylist()) == [1, 2]


def test_type_mismatches_and_malformed_records_are_rescued(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    write_json(src, "a.json", [{"id": 1, "score": 1.5}])
    run(src, out, chk, **opts(tmp_path))
    (src / "b.json").write_text('{"id": "not-a-number", "score": 2.5}\n{broken json\n{"id": 3, "score": "high"}\n[1, 2]\n')
    run(src, out, chk, **opts(tmp_path))
    t = output(out)
    assert t.num_rows == 5  # rows are never dropped
    rows = t.to_pylist()
    bad = [json.loads(r["_rescued_data"]) for r in rows if r["_rescued_data"]]
    assert {"id": "not-a-number", "_file_path": bad[0]["_file_path"]} in bad
    assert any(b.get("_malformed_record") == "{broken json" for b in bad)
    assert any(b.get("score") == "high" for b in bad)
    assert any(b.get("_malformed_record") == "[1, 2]" for b in bad)
    assert all(b["_file_path"].endswith("b.json") for b in bad)
    assert sorted(r["id"] for r in rows if r["id"] is not None) == [1, 3]


def test_schema_from_hints_when_no_files_yet_and_custom_rescue_column(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    src.mkdir()
    more = {"cloudFiles.schemaHints": "id BIGINT, name STRING", "rescuedDataColumn": "_bad"}
    run(src, out, chk, **opts(tmp_path, **more))
    write_json(src, "a.json", [{"id": 1, "name": "x"}, {"id": 2, "name": 5}])
    run(src, out, chk, **opts(tmp_path, **more))
    t = output(out)
    assert t.column_names == ["id", "name", "_bad"]
    assert t.schema.field("id").type == pa.int64()
    assert sorted(t.column("name").to_pylist()) == ["5", "x"]  # a number in a string column is kept as text


def test_no_files_and_no_hints_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    with pytest.raises(Exception, match="cannot infer the schema.*no files yet.*schemaHints"):
        run(tmp_path / "in", tmp_path / "out", tmp_path / "chk", **opts(tmp_path))


def test_stored_schema_is_reused_after_restart(tmp_path: Path) -> None:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    write_json(src, "a.json", [{"id": 1}])
    run(src, out, chk, **opts(tmp_path))
    write_json(src, "b.json", [{"id": 2.5}])  # would widen to double if inferred again
    run(src, out, chk, **opts(tmp_path))
    t = output(out)
    assert t.schema.field("id").type == pa.int64()
    assert json.loads(next(r for r in t.to_pylist() if r["_rescued_data"])["_rescued_data"])["id"] == 2.5

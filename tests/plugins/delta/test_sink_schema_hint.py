"""A batch whose columns the Delta table refuses: the error says what differs and names the fix
(mergeSchema=true, as Spark does), and applying the fix works, through the API and the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import headrace as hr
from headrace.plugins import registry
from headrace.protocols import SinkContext
from tests.cli_runner import run_cli


def make_sink(path: str, **options: Any) -> Any:
    spec = registry().get("delta")
    opts = spec.sink_options.parse({"path": path, **options}, connector="delta", role="sink")
    return spec.load_sink()(opts, SinkContext(query_id="q1", output_mode="append"))


def put(sink: Any, batch_id: int, table: pa.Table) -> None:
    sink.commit(batch_id, [sink.write(batch_id, iter(table.to_batches()))])


FIRST = pa.table({"id": pa.array([1], pa.int64()), "v": ["a"], "w": [1.5]})


@pytest.mark.parametrize(
    ("batch", "needle"),
    [
        pytest.param(pa.table({"id": pa.array([2], pa.int64()), "v": ["b"], "w": [2.5], "extra": [True]}),
                     "new column(s) extra (bool)", id="new-column"),
        pytest.param(pa.table({"id": pa.array([2], pa.int64()), "v": ["b"]}), "column(s) w missing from the batch",
                     id="missing-column"),
    ],
)  # fmt: skip
def test_a_mismatch_names_merge_schema_and_setting_it_writes_the_batch(tmp_path: Path, batch: pa.Table, needle: str) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out), 0, FIRST)
    with pytest.raises(hr.HeadraceError) as e:
        put(make_sink(out), 1, batch)
    text = str(e.value)
    assert "writing batch 1 to Delta table" in text and needle in text, text
    assert "set the sink option mergeSchema=true" in text and "Cannot cast schema" in text, text
    put(make_sink(out, mergeSchema="true"), 1, batch)  # the fix, applied
    rows = DeltaTable(out).to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in rows) == [1, 2]
    names = {n.lower() for n in DeltaTable(out).schema().to_arrow().names}
    assert names == {"id", "v", "w"} | {n.lower() for n in batch.column_names}


def test_a_second_spelling_of_a_column_is_named_and_the_fixes_work(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out), 0, FIRST)
    batch = pa.table({"id": pa.array([2], pa.int64()), "V": ["b"], "w": [2.5], "Extra": ["x"]})
    with pytest.raises(hr.HeadraceError) as e:
        put(make_sink(out), 1, batch)
    text = str(e.value)
    assert "spelled differently from the table's: V to v" in text and "new column(s) Extra (string)" in text, text
    assert "Fix: rename V to v in the query; set the sink option mergeSchema=true" in text, text
    put(make_sink(out, mergeSchema="true"), 1, batch.rename_columns(["id", "v", "w", "Extra"]))
    assert sorted(r["id"] for r in DeltaTable(out).to_pyarrow_table().to_pylist()) == [1, 2]


def test_a_type_the_table_cannot_take_is_not_sent_to_merge_schema(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    put(make_sink(out), 0, FIRST)
    with pytest.raises(hr.HeadraceError) as e:
        put(make_sink(out), 1, pa.table({"id": [[2]], "v": ["b"], "w": [2.5]}))
    text = str(e.value)
    assert "id is list<item: int64> in the batch but int64 in the table" in text, text
    assert "Fix: cast the column(s) to the table's type" in text and "mergeSchema" not in text, text


def test_the_cli_hint_after_a_cloudfiles_schema_change_works_as_printed(tmp_path: Path) -> None:
    """The documented flow: a new JSON field stops the stream (addNewColumns), the restart reads it,
    the Delta sink refuses the new column naming mergeSchema; the pipeline file edited as the
    error says, the run succeeds."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "1.json").write_text('{"id": 1, "v": "a"}\n')
    toml = tmp_path / "p.toml"
    toml.write_text('name = "orders"\ncheckpoint = "out/checkpoint"\n\n[source]\nformat = "cloudFiles"\npath = "in"\n'
                    'options = { "cloudFiles.format" = "json", "cloudFiles.schemaLocation" = "out/schema" }\n\n'
                    '[sink]\nformat = "delta"\npath = "out/table"\n')  # fmt: skip
    assert run_cli("run", toml, timeout=120).returncode == 0
    (tmp_path / "in" / "2.json").write_text('{"id": 2, "v": "b", "extra": 5}\n')
    changed = run_cli("run", toml, timeout=120)
    assert changed.returncode == 1 and "Restart the query" in changed.stderr
    refused = run_cli("run", toml, timeout=120)
    assert refused.returncode == 1 and "new column(s) extra" in refused.stderr, refused.stderr
    hint = "options = { mergeSchema = true } under [sink]"
    assert hint in refused.stderr, refused.stderr
    toml.write_text(toml.read_text() + hint.removesuffix(" under [sink]") + "\n")  # [sink] is the last table
    done = run_cli("run", toml, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = sorted(DeltaTable(str(tmp_path / "out" / "table")).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["extra"]) for r in rows] == [("1", None), ("2", "5")]

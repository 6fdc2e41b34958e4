"""Reading a batch's files: several plain files by one pyarrow dataset scan, with the same rows,
order and schema as reading them file by file."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pyarrow as pa
import pytest

from headrace.errors import DataLossError
from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext
from headrace_delta import _read
from headrace_delta._read import DeltaPartition, FileTask, read_file, read_files_scanned
from tests.plugins.delta.helpers import append, delete_with_deletion_vector


def make_source(path: str, **options: object):  # type: ignore[no-untyped-def]
    spec = registry().get("delta")
    opts = spec.source_options.parse({"path": path, **options}, connector="delta", role="source")
    return spec.load_source()(opts, SourceContext(query_id="q"))


def snapshot_tasks(path: str) -> tuple[object, list[FileTask]]:
    src = make_source(path)
    start = src.initial_offset()
    end = src.latest_offset(start, ReadLimit())
    tasks = [t for p in src.partitions(start, end) for t in p.items]  # type: ignore[attr-defined]
    return src, tasks


def file_by_file(src: object, tasks: list[FileTask]) -> pa.Table:
    batches = [b for t in tasks for b in read_file(src.loc, t, src._table_schema, out_schema=src.schema,  # type: ignore[attr-defined]
                                                    event_column=None, fail_on_data_loss=True)]  # fmt: skip
    return pa.Table.from_batches(batches, schema=src.schema)  # type: ignore[attr-defined]


@pytest.fixture
def evolved(tmp_path: Path) -> str:
    """Partitioned by an int, a date (one null) and a string; a column added by a later commit;
    several files per commit."""
    path = str(tmp_path / "t")
    day = dt.date(2024, 5, 1)
    parts = ["p", "d", "s"]
    append(path, [1, 2, 3], p=[7, 7, 8], d=pa.array([day, day, None], pa.date32()), s="a b/c", partition_by=parts)
    append(path, [4], p=8, d=pa.array([day]), s="x", partition_by=parts)
    append(path, [5, 6], p=9, d=pa.array([None, None], pa.date32()), s="y", w=[1.5, None], partition_by=parts,
           schema_mode="merge")  # fmt: skip
    return path


@pytest.mark.parametrize("scan_bytes", [_read.SCAN_BYTES, 1, 2000], ids=["one-scan", "every-file-alone", "small-scans"])
def test_scan_gives_the_rows_order_and_schema_of_file_by_file_reading(evolved: str, monkeypatch: pytest.MonkeyPatch,
                                                                      scan_bytes: int) -> None:  # fmt: skip
    src, tasks = snapshot_tasks(evolved)
    assert len(tasks) >= 4 and all(t.size > 0 for t in tasks)
    monkeypatch.setattr(_read, "SCAN_BYTES", scan_bytes)
    batches = list(read_files_scanned(src.loc, tasks, src.schema, fail_on_data_loss=True))  # type: ignore[attr-defined]
    assert all(b.schema == src.schema and b.num_rows for b in batches)  # type: ignore[attr-defined]
    scanned = pa.Table.from_batches(batches, schema=src.schema)  # type: ignore[attr-defined]
    assert scanned.to_pylist() == file_by_file(src, tasks).to_pylist()
    assert sorted(scanned.column("v").to_pylist()) == [1, 2, 3, 4, 5, 6]
    assert {r["v"]: r["w"] for r in scanned.to_pylist()} == {1: None, 2: None, 3: None, 4: None, 5: 1.5, 6: None}


def test_a_snapshot_of_plain_files_is_one_partition(evolved: str) -> None:
    src = make_source(evolved)
    start = src.initial_offset()
    parts = src.partitions(start, src.latest_offset(start, ReadLimit()))
    assert len(parts) == 1 and isinstance(parts[0], DeltaPartition) and len(parts[0].items) >= 4


def test_files_with_deletion_vectors_are_read_file_by_file_in_parallel_partitions(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    for k in range(4):
        append(path, [10 * k + 1, 10 * k + 2])
    delete_with_deletion_vector(path, [0])  # in the first file
    src = make_source(path)
    start = src.initial_offset()
    parts = src.partitions(start, src.latest_offset(start, ReadLimit()))
    assert len(parts) > 1
    got = [v for p in parts for b in src.read(p) for v in b.column("v").to_pylist()]
    assert sorted(got) == sorted({1, 2, 11, 12, 21, 22, 31, 32} - {got_first_deleted(path)})


def got_first_deleted(path: str) -> int:
    """The value of row 0 of the file that delete_with_deletion_vector gave a deletion vector."""
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    first = pa.table(DeltaTable(path, version=3).get_add_actions(flatten=True)).column("path")[0].as_py()
    return int(pq.read_table(f"{path}/{first}").column("v")[0].as_py())


def test_a_scan_that_fails_is_read_again_file_by_file(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    for k in range(3):
        append(path, [k])
    src, tasks = snapshot_tasks(path)
    assert len(tasks) == 3
    values = file_by_file(src, tasks).column("v").to_pylist()
    os.remove(src.loc.data_path(tasks[1].path))  # type: ignore[attr-defined]
    kept = list(read_files_scanned(src.loc, tasks, src.schema, fail_on_data_loss=False))  # type: ignore[attr-defined]
    assert [v for b in kept for v in b.column("v").to_pylist()] == [values[0], values[2]]
    with pytest.raises(DataLossError, match=f"data file {tasks[1].path} of Delta table"):
        list(read_files_scanned(src.loc, tasks, src.schema, fail_on_data_loss=True))  # type: ignore[attr-defined]


"""The files sink writes every row of a batch once, in Parquet or Arrow IPC, partitioned or
not, and no file for a batch of empty record batches; an unpartitioned write does not import
``pyarrow.dataset`` (a fresh Spark Python worker would pay its import, pandas included)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from headrace._builtin import FILES_OPTIONS
from headrace.connectors.files import FilesSink, read_files
from headrace.protocols import SinkContext

SCHEMA = pa.schema([("id", pa.int64()), ("k", pa.string())])
EMPTY = pa.record_batch([pa.array([], pa.int64()), pa.array([], pa.string())], schema=SCHEMA)


def _sink(path: Path, fmt: str, partition_by: str | None = None) -> FilesSink:
    raw = {"path": str(path), "format": fmt, **({"partitionBy": partition_by} if partition_by else {})}
    return FilesSink(FILES_OPTIONS.parse(raw, connector="files", role="sink"), SinkContext(schema=SCHEMA))


def _batches() -> list[pa.RecordBatch]:
    return [
        EMPTY,
        pa.record_batch([pa.array([1, 2, 3]), pa.array(["a", "b", "a"])], schema=SCHEMA),
        EMPTY,
        pa.record_batch([pa.array([4]), pa.array(["b"])], schema=SCHEMA),
    ]


@pytest.mark.parametrize("partition_by", [None, "k"], ids=["unpartitioned", "partitioned"])
@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_every_row_is_written_once(tmp_path: Path, fmt: str, partition_by: str | None) -> None:
    sink = _sink(tmp_path / "out", fmt, partition_by)
    for batch_id in range(2):
        sink.commit(batch_id, [sink.write(batch_id, iter(_batches()))])
    got = read_files(str(tmp_path / "out"), fmt)
    rows = sorted((r["id"], str(r["k"])) for r in got.to_pylist())
    assert rows == sorted([(1, "a"), (2, "b"), (3, "a"), (4, "b")] * 2)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_empty_batches_write_no_file(tmp_path: Path, fmt: str) -> None:
    sink = _sink(tmp_path / "out", fmt)
    sink.commit(0, [sink.write(0, iter([EMPTY, EMPTY]))])
    assert [p for p in (tmp_path / "out").rglob("*") if p.is_file() and "_commits" not in p.parts] == []
    assert (tmp_path / "out" / "_commits" / "0").read_text() == "0"


def test_an_unpartitioned_write_does_not_import_pyarrow_dataset(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "import pyarrow as pa\n"
        "from headrace._builtin import FILES_OPTIONS\n"
        "from headrace.connectors.files import FilesSink\n"
        "from headrace.protocols import SinkContext\n"
        f"opts = FILES_OPTIONS.parse({{'path': {str(tmp_path / 'out')!r}, 'format': 'parquet'}}, connector='files', role='sink')\n"
        "sink = FilesSink(opts, SinkContext())\n"
        "batch = pa.RecordBatch.from_arrays([pa.array([1, 2])], names=['id'])\n"
        "sink.commit(0, [sink.write(0, iter([batch]))])\n"
        "print('pyarrow.dataset' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"], out.stderr  # (pa.array of a list imports pandas: not checked)
    assert read_files(str(tmp_path / "out")).num_rows == 2

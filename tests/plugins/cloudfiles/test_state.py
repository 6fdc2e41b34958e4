"""The file index under the checkpoint (``sources/0/files.db``) lost or damaged: a restart is
refused with a CheckpointError naming the file, never accepted silently (old files ingested
again, new ones skipped) and never a raw sqlite3 error."""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.errors import CheckpointError, StreamingQueryException
from tests.plugins.cloudfiles.helpers import output, run, write_json


def opts(tmp_path: Path) -> dict[str, Any]:
    return {"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.schemaLocation": str(tmp_path / "schema")}  # fmt: skip


def index_path(chk: Path) -> Path:
    return chk / "sources" / "0" / "files.db"


def remove(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)


def truncate_to(size: Callable[[int], int]) -> Callable[[Path], None]:
    def damage(db: Path) -> None:
        with open(db, "r+b") as f:
            f.truncate(size(os.path.getsize(db)))

    return damage


def garble(db: Path) -> None:
    data = bytearray(db.read_bytes())
    for i in range(100, len(data), 7):
        data[i] = (data[i] * 31 + 17) % 256
    db.write_bytes(bytes(data))


def garble_page(page: int) -> Callable[[Path], None]:
    """Damage one page only: the database opens, a later query (or the check at start) finds it."""

    def damage(db: Path) -> None:
        data = bytearray(db.read_bytes())
        assert len(data) > (page + 1) * 4096, len(data)
        for i in range(page * 4096 + 8, (page + 1) * 4096, 5):
            data[i] = (data[i] * 31 + 17) % 256
        db.write_bytes(bytes(data))

    return damage


def garble_header(db: Path) -> None:
    data = bytearray(db.read_bytes())
    data[:16] = b"not sqlite at al"
    db.write_bytes(bytes(data))


def empty_tables(db: Path) -> None:
    con = sqlite3.connect(db)
    con.execute("DELETE FROM files")
    con.execute("DELETE FROM seen")
    con.commit()
    con.close()


DAMAGE = {
    "missing": remove,
    "empty": truncate_to(lambda n: 0),
    "truncated": truncate_to(lambda n: n // 2),
    "garbled-pages": garble,
    "garbled-header": garble_header,
    "garbled-page-1": garble_page(1),
    "garbled-page-2": garble_page(2),
    "garbled-page-3": garble_page(3),
    "tables-emptied": empty_tables,
}


def checkpoint_error(e: BaseException) -> CheckpointError:
    cause = e.cause if isinstance(e, StreamingQueryException) else e
    assert isinstance(cause, CheckpointError), f"{type(cause).__name__}: {cause}"
    chain: BaseException | None = e
    while chain is not None:  # a raw sqlite3 error never reaches the user as the error itself
        assert chain is cause.__cause__ or not isinstance(chain, sqlite3.Error)
        chain = chain.__cause__ if chain is not cause.__cause__ else None
    return cause


def first_run(tmp_path: Path) -> tuple[Path, Path, Path]:
    src, out, chk = tmp_path / "in", tmp_path / "out", tmp_path / "chk"
    for i in range(20):
        write_json(src, f"day={i % 3}/f{i:02d}-{'x' * 150}.json", [{"id": i, "pad": "x" * 200}])
    run(src, out, chk, **{**opts(tmp_path), "cloudFiles.maxFilesPerTrigger": 5})
    assert sorted(output(out).column("id").to_pylist()) == list(range(20))
    return src, out, chk


@pytest.mark.parametrize("damage", list(DAMAGE), ids=list(DAMAGE))
def test_lost_or_damaged_index_is_refused(tmp_path: Path, damage: str) -> None:
    src, out, chk = first_run(tmp_path)
    db = index_path(chk)
    assert db.exists()
    DAMAGE[damage](db)
    write_json(src, "g.json", [{"id": 100, "pad": ""}])
    with pytest.raises((StreamingQueryException, CheckpointError)) as e:
        run(src, out, chk, **opts(tmp_path))
    err = checkpoint_error(e.value)
    assert str(db) in str(err) and "new checkpointLocation" in str(err)
    assert sorted(output(out).column("id").to_pylist()) == list(range(20))  # nothing ingested twice
    with pytest.raises((StreamingQueryException, CheckpointError)):  # and it stays refused
        run(src, out, chk, **opts(tmp_path))


def test_index_of_another_query_is_refused(tmp_path: Path) -> None:
    src, out, chk = first_run(tmp_path)
    other = tmp_path / "other"
    run(src, other / "out", other / "chk", **{**opts(tmp_path), "cloudFiles.maxFilesPerTrigger": 7})
    shutil.copy(index_path(other / "chk"), index_path(chk))
    with pytest.raises((StreamingQueryException, CheckpointError)) as e:
        run(src, out, chk, **opts(tmp_path))
    err = checkpoint_error(e.value)
    assert str(index_path(chk)) in str(err) and "belongs to query" in str(err)


def test_index_without_owner_from_an_older_version_is_adopted(tmp_path: Path) -> None:
    src, out, chk = first_run(tmp_path)
    con = sqlite3.connect(index_path(chk))
    con.execute("DELETE FROM meta WHERE key = 'query_id'")
    con.commit()
    con.close()
    write_json(src, "g.json", [{"id": 100, "pad": ""}])
    run(src, out, chk, **opts(tmp_path))
    assert sorted(output(out).column("id").to_pylist()) == [*range(20), 100]



def test_lost_index_of_a_source_that_never_admitted_a_file_is_refused(tmp_path: Path) -> None:
    """A union where the cloudFiles source has not admitted any file yet (its offset is still
    #0) but the other source committed batches: the index still holds what
    includeExistingFiles=false excluded, so losing it is refused too (the engine tells the
    source that the checkpoint has committed batches)."""
    import headrace as hr
    from headrace.testing import memory_stream

    land, chk, name = tmp_path / "land", tmp_path / "chk", f"rows-{tmp_path.name}"
    write_json(land, "old.json", [{"id": 1}])
    memory_stream(name).add(pa.table({"id": [7]}))
    more = {**opts(tmp_path), "cloudFiles.includeExistingFiles": "false"}

    def run_union() -> hr.StreamingQuery:
        files = hr.read_stream.format("cloudFiles").options(more).schema("id BIGINT").load(str(land))
        rows = hr.read_stream.format("memory").option("name", name).load()
        q = (files.union(rows).write_stream.format("memory").query_name(name + "-out")
             .option("checkpointLocation", str(chk)).trigger(available_now=True).start())  # fmt: skip
        q.await_termination(30)
        return q

    assert run_union().exception() is None
    remove(index_path(chk))
    with pytest.raises((StreamingQueryException, CheckpointError)) as e:
        run_union()
    assert str(index_path(chk)) in str(checkpoint_error(e.value))

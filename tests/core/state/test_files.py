"""State files bound to their place: every changelog, snapshot, RocksDB database and folder
``metadata`` records the query, operator, partition (and the files their kind and version),
and a file copied over another, a folder swapped with another query's, or a layout damaged by
hand is refused with ``CheckpointError`` naming the path, on both backends."""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.errors import CheckpointError
from headrace.state import StateStore, open_state_store

BACKENDS = ["memory", "rocksdb"]
KEYS = pa.schema([("user", pa.string())])
VALUES = pa.schema([("n", pa.int64())])


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "rocksdb":
        pytest.importorskip("rocksdict")
    return str(request.param)


def store(backend: str, path: Path, query: str = "q-1", operator: str = "0:aggregate", **kw: Any) -> StateStore:
    return open_state_store(backend, str(path), KEYS, VALUES, description="test", query_id=query,
                            operator_id=operator, **kw)  # fmt: skip


def run(backend: str, path: Path, versions: int, query: str = "q-1", **kw: Any) -> None:
    """Versions 0..versions-1, each adding one to user ``a`` and adding a user of its own."""
    s = store(backend, path, query, **kw)
    s.load(-1)
    for v in range(versions):
        got, found = s.get(pa.table({"user": ["a"]}, schema=KEYS))
        n = (got.column("n")[0].as_py() if found[0] else 0) + 1
        s.put(pa.table({"user": ["a", f"u{v}"]}, schema=KEYS), pa.table({"n": [n, v]}, schema=VALUES))
        s.commit(v)
        s.settle()
        s.load(v)
    s.close()


def drop_working_db(backend: str, path: Path) -> None:
    """RocksDB: delete the working database, so the restore reads the files (it is a cache)."""
    if backend == "rocksdb":
        shutil.rmtree(path / "rocksdb")


def test_a_changelog_copied_over_the_next_is_refused(backend: str, tmp_path: Path) -> None:
    run(backend, tmp_path, 4)
    shutil.copyfile(tmp_path / "changelog" / "2", tmp_path / "changelog" / "3")
    drop_working_db(backend, tmp_path)
    s = store(backend, tmp_path)
    with pytest.raises(CheckpointError, match=r"changelog/3 is not the file .*version 2 \(expected 3\)"):
        s.load(3)
    s.close()


def test_an_older_changelog_copied_over_the_newest_snapshot_is_refused(tmp_path: Path) -> None:
    """Memory backend: a snapshot replaced by an older changelog (windows would be emitted
    twice) is refused naming the snapshot."""
    run("memory", tmp_path, 6, snapshot_interval=2)
    snaps = sorted(int(p.name) for p in (tmp_path / "snapshot").iterdir())
    assert snaps, "a snapshot was written"
    newest = tmp_path / "snapshot" / str(snaps[-1])
    shutil.copyfile(tmp_path / "changelog" / "1", newest)
    s = store("memory", tmp_path, snapshot_interval=2)
    with pytest.raises(CheckpointError, match=rf"{newest} is not the file .*kind 'changelog' \(expected 'snapshot'\)"):
        s.load(5)
    s.close()


def test_an_older_rocksdb_checkpoint_copied_over_the_newest_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("rocksdict")
    run("rocksdb", tmp_path, 6, snapshot_interval=2)
    snaps = sorted(int(p.name.split(".")[0]) for p in (tmp_path / "snapshot").iterdir())
    assert len(snaps) >= 2
    newest, older = (tmp_path / "snapshot" / f"{v}.rocksdb" for v in (snaps[-1], snaps[0]))
    shutil.rmtree(newest)
    shutil.copytree(older, newest)
    drop_working_db("rocksdb", tmp_path)
    s = store("rocksdb", tmp_path, snapshot_interval=2)
    with pytest.raises(CheckpointError, match=rf"{newest} holds version {snaps[0]}, not {snaps[-1]}"):
        s.load(5)
    s.close()


@pytest.mark.parametrize(
    "other", [{"query": "q-2"}, {"operator": "0:deduplicate"}, {"partition": 1}], ids=["query", "operator", "partition"]
)
def test_a_state_folder_of_another_query_operator_or_partition_is_refused(
    backend: str, tmp_path: Path, other: dict[str, Any]
) -> None:
    run(backend, tmp_path / "theirs", 3, **other)
    run(backend, tmp_path / "ours", 3)
    shutil.rmtree(tmp_path / "ours")
    shutil.copytree(tmp_path / "theirs", tmp_path / "ours")  # the whole folder swapped
    field = {"query": "queryId", "operator": "operatorId", "partition": "partition"}[next(iter(other))]
    with pytest.raises(CheckpointError, match=rf"metadata .*records {field} .*copied or swapped"):
        store(backend, tmp_path / "ours")


def test_a_changelog_of_another_query_is_refused(backend: str, tmp_path: Path) -> None:
    run(backend, tmp_path / "theirs", 3, query="q-2")
    run(backend, tmp_path / "ours", 3)
    shutil.copyfile(tmp_path / "theirs" / "changelog" / "2", tmp_path / "ours" / "changelog" / "2")
    drop_working_db(backend, tmp_path / "ours")
    s = store(backend, tmp_path / "ours")
    with pytest.raises(CheckpointError, match=r"changelog/2 is not the file .*query 'q-2' \(expected 'q-1'\)"):
        s.load(2)
    s.close()


def test_a_rocksdb_working_database_of_another_query_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("rocksdict")
    run("rocksdb", tmp_path / "theirs", 3, query="q-2")
    run("rocksdb", tmp_path / "ours", 3)
    shutil.rmtree(tmp_path / "ours" / "rocksdb")
    shutil.copytree(tmp_path / "theirs" / "rocksdb", tmp_path / "ours" / "rocksdb")
    s = store("rocksdb", tmp_path / "ours")
    with pytest.raises(CheckpointError, match=r"state database .*ours/rocksdb belongs to other state: .*query 'q-2'"):
        s.load(2)
    s.close()


def test_the_files_hold_what_their_path_says_and_restore(backend: str, tmp_path: Path) -> None:
    """The identity is in the file (checksummed with it), and a restore of untouched files
    gives the state back."""
    run(backend, tmp_path, 3)
    data = (tmp_path / "changelog" / "1").read_bytes()
    magic, _, length, ident_len = struct.unpack(">8sIQI", data[-24:])
    assert magic == b"HRSTATE2"
    ident = json.loads(data[length : length + ident_len])
    assert ident == {"query": "q-1", "operator": "0:aggregate", "partition": 0, "kind": "changelog", "version": 1}
    drop_working_db(backend, tmp_path)
    s = store(backend, tmp_path)
    s.load(2)
    got, _ = s.get(pa.table({"user": ["a"]}, schema=KEYS))
    assert got.column("n").to_pylist() == [3] and len(s) == 4
    s.close()


def _to_legacy(path: Path) -> None:
    """Rewrite a state file in the format of earlier versions (``HRSTATE1``: no identity)."""
    data = path.read_bytes()
    _, _, length, _ = struct.unpack(">8sIQI", data[-24:])
    payload = data[:length]
    path.write_bytes(payload + struct.pack(">8sIQ", b"HRSTATE1", zlib.crc32(payload), len(payload)))


def test_a_memory_folder_of_an_earlier_version_is_adopted_and_then_bound(tmp_path: Path) -> None:
    """A folder written before files recorded identities (metadata without them, HRSTATE1
    files) restores; its metadata then records this query and ``identitySince``, the files of
    later versions are bound, and an HRSTATE1 file copied in among those is refused."""
    run("memory", tmp_path, 3)
    for f in (tmp_path / "changelog").iterdir():
        _to_legacy(f)
    meta = json.loads((tmp_path / "metadata").read_text())
    for k in ("queryId", "operatorId", "partition"):
        del meta[k]
    (tmp_path / "metadata").write_text(json.dumps(meta))
    s = store("memory", tmp_path)
    s.load(2)
    got, _ = s.get(pa.table({"user": ["a"]}, schema=KEYS))
    assert got.column("n").to_pylist() == [3]
    s.put(pa.table({"user": ["b"]}, schema=KEYS), pa.table({"n": [1]}, schema=VALUES))
    s.commit(3)
    s.close()
    meta = json.loads((tmp_path / "metadata").read_text())
    assert (meta["queryId"], meta["identitySince"]) == ("q-1", 3)
    with pytest.raises(CheckpointError, match="another query"):
        store("memory", tmp_path, query="q-2")
    shutil.copyfile(tmp_path / "changelog" / "2", tmp_path / "changelog" / "3")
    s = store("memory", tmp_path)
    with pytest.raises(CheckpointError, match=r"changelog/3 is of the format of an earlier headrace"):
        s.load(3)
    s.close()


def test_an_earlier_format_file_in_a_bound_folder_is_refused(backend: str, tmp_path: Path) -> None:
    run(backend, tmp_path, 3)
    _to_legacy(tmp_path / "changelog" / "2")
    drop_working_db(backend, tmp_path)
    s = store(backend, tmp_path)
    with pytest.raises(CheckpointError, match=r"changelog/2 is of the format of an earlier headrace .*HRSTATE1"):
        s.load(2)
    s.close()


# ---------------------------------------------------------------------------- layout damage
def _folder_for_file(p: Path) -> None:
    p.unlink()
    p.mkdir()
    (p / "x").write_text("x")


def _file_for_folder(p: Path) -> None:
    shutil.rmtree(p)
    p.write_text("not a folder")


LAYOUT = {
    "changelog-is-a-folder": ("changelog/2", _folder_for_file, "load"),
    "changelog-folder-is-a-file": ("changelog", _file_for_folder, "open"),
    "snapshot-folder-is-a-file": ("snapshot", _file_for_folder, "open"),
    "metadata-is-a-folder": ("metadata", _folder_for_file, "open"),
}


@pytest.mark.parametrize("case", list(LAYOUT), ids=list(LAYOUT))
def test_layout_damage_is_a_checkpoint_error_naming_the_path(backend: str, tmp_path: Path, case: str) -> None:
    rel, damage, when = LAYOUT[case]
    run(backend, tmp_path, 3)
    damage(tmp_path / rel)
    drop_working_db(backend, tmp_path)
    with pytest.raises(CheckpointError, match=str(tmp_path / rel)) as e:
        s = store(backend, tmp_path)
        assert when == "load", "refused when the store opens"
        try:
            s.load(2)
        finally:
            s.close()
    assert "changed outside headrace" in str(e.value)


def test_the_state_folder_replaced_by_a_file_is_a_checkpoint_error(backend: str, tmp_path: Path) -> None:
    run(backend, tmp_path / "s", 1)
    _file_for_folder(tmp_path / "s")
    with pytest.raises(CheckpointError, match=str(tmp_path / "s")):
        store(backend, tmp_path / "s")


def test_a_rocksdb_checkpoint_replaced_by_a_file_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("rocksdict")
    run("rocksdb", tmp_path, 4, snapshot_interval=2)
    snap = max((p for p in (tmp_path / "snapshot").iterdir() if p.name.endswith(".rocksdb")),
               key=lambda p: int(p.name.split(".")[0]))  # fmt: skip
    _file_for_folder(snap)
    drop_working_db("rocksdb", tmp_path)
    s = store("rocksdb", tmp_path, snapshot_interval=2)
    with pytest.raises(CheckpointError, match=str(snap)):
        s.load(3)
    s.close()


# ---------------------------------------------------------------------------- through the engine
SCHEMA = pa.schema([("user", pa.string()), ("value", pa.int64())])


def _run_query(name: str, chk: Path, backend: str, rows: list[pa.Table]) -> list[dict[str, Any]]:
    import headrace as hr
    from headrace.testing import memory_stream

    stream = memory_stream(name, SCHEMA)
    out = f"{name}-out"
    frame = hr.read_stream.format("memory").option("name", name).load().group_by("user").agg("count(*) AS n")
    q = (frame.write_stream.format("memory").query_name(out).output_mode("update")
         .option("checkpointLocation", str(chk)).option("stateStore", backend)
         .trigger(processing_time="10 milliseconds").start())  # fmt: skip
    try:
        for t in rows:
            stream.add(t)
            q.process_all_available(30)
    finally:
        q.stop()
    if q.exception() is not None:
        raise q.exception()  # type: ignore[misc]
    return sorted(hr.memory_table(out).to_pylist(), key=lambda r: (r["user"], r["n"]))


def test_a_query_refuses_the_state_folder_of_another_query(backend: str, tmp_path: Path) -> None:
    """Two checkpoints of the same query: each restarts on its own state (the checkpoint's
    query id reaches every state file), and swapping their ``state/`` folders is refused at
    start, naming the query ids, instead of counting on from the other query's counts."""
    import uuid

    a, b = (f"bind-{x}-{uuid.uuid4().hex[:6]}" for x in "ab")
    rows = [pa.table({"user": ["x", "y", "x"], "value": [1, 2, 3]}, schema=SCHEMA)]
    assert _run_query(a, tmp_path / "a", backend, rows) == [{"user": "x", "n": 2}, {"user": "y", "n": 1}]
    _run_query(b, tmp_path / "b", backend, rows + rows)
    query_a = json.loads((tmp_path / "a" / "metadata").read_text())["id"]
    state_meta = json.loads((tmp_path / "a" / "state" / "0" / "metadata").read_text())
    assert (state_meta["queryId"], state_meta["operatorId"]) == (query_a, "0:stateStoreSave")
    again = _run_query(a, tmp_path / "a", backend, rows)  # counts on from its own state
    assert {"user": "x", "n": 4} in again and {"user": "y", "n": 2} in again
    shutil.rmtree(tmp_path / "a" / "state")
    shutil.copytree(tmp_path / "b" / "state", tmp_path / "a" / "state")
    with pytest.raises(CheckpointError, match=rf"records queryId '[0-9a-f-]+' \(this query's: '{query_a}'\)"):
        _run_query(a, tmp_path / "a", backend, rows)


def test_a_query_whose_state_folder_is_a_file_fails_with_a_checkpoint_error(backend: str, tmp_path: Path) -> None:
    import uuid

    name = f"layout-{uuid.uuid4().hex[:6]}"
    rows = [pa.table({"user": ["x"], "value": [1]}, schema=SCHEMA)]
    _run_query(name, tmp_path / "c", backend, rows)
    _file_for_folder(tmp_path / "c" / "state")
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'c' / 'state'} is a file"):
        _run_query(name, tmp_path / "c", backend, rows)

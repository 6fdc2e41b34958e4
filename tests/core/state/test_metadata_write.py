"""A new state folder's metadata is written off the query's start path, but always before
the folder's first changelog (so before any commit marker can count on that changelog)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from headrace.state import open_state_store
from headrace.state import store as store_module


def _open(backend: str, path: Path) -> store_module.StateStore:
    return open_state_store(backend, str(path), pa.schema([("k", pa.int64())]), pa.schema([("n", pa.int64())]),
                            description="test")  # fmt: skip


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_the_first_changelog_is_durable_only_with_the_metadata(backend: str, tmp_path: Path) -> None:
    s = _open(backend, tmp_path)
    s.load(-1)
    s.put(pa.table({"k": [1, 2]}), pa.table({"n": [5, 6]}))
    s.commit(0, wait=False)
    w = s.pending_write()
    assert w is not None
    w.result()
    assert json.loads((tmp_path / "metadata").read_text())["keySchema"] == [["k", "int64"]]
    assert any(n.name.startswith("0") for n in (tmp_path / "changelog").iterdir())
    s.close()
    s2 = _open(backend, tmp_path)  # checks the stored file against the same schemas
    s2.load(0)
    assert len(s2) == 2
    s2.close()


def test_a_failed_metadata_write_fails_the_first_changelog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(path: str, data: bytes, **kw: object) -> None:
        raise OSError(f"disk full writing {path}")

    monkeypatch.setattr(store_module, "atomic_write", broken)
    s = _open("memory", tmp_path)
    s.load(-1)
    s.put(pa.table({"k": [1]}), pa.table({"n": [5]}))
    s.commit(0, wait=False)
    w = s.pending_write()
    assert w is not None
    with pytest.raises(OSError, match="disk full writing .*metadata"):
        w.result()  # the engine's marker job calls this: no marker for batch 0
    assert not (tmp_path / "changelog" / "0").exists()
    s.close()  # logs the failure, raises nothing

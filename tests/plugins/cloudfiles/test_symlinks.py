"""Symbolic links inside the load path are never followed: files outside it are never read,
moved or deleted, and a link loop does not ingest a file twice."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from headrace_cloudfiles.local import LocalStore, NotARegularFileError
from tests.plugins.cloudfiles.helpers import output, run, write_json

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink") or os.name == "nt", reason="POSIX symlinks")


def opts(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.schemaLocation": str(tmp_path / "schema"), "cloudFiles.partitionColumns": "", **more}  # fmt: skip


def ids(out: Path) -> list[int]:
    return sorted(output(out).column("id").to_pylist())


@pytest.mark.parametrize("clean", ["DELETE", "MOVE"])
def test_folder_link_to_outside_is_not_read_nor_cleaned(tmp_path: Path, clean: str) -> None:
    land, outside, archive = tmp_path / "land", tmp_path / "outside", tmp_path / "archive"
    write_json(land, "own.json", [{"id": 1}])
    write_json(outside, "theirs.json", [{"id": 99}])
    os.symlink(outside, land / "ext")
    more: dict[str, Any] = {"cloudFiles.cleanSource": clean, "cloudFiles.cleanSource.retentionDuration": "0s"}
    if clean == "MOVE":
        more["cloudFiles.cleanSource.moveDestination"] = str(archive)
    run(land, tmp_path / "out", tmp_path / "chk", **opts(tmp_path, **more))
    assert ids(tmp_path / "out") == [1]
    assert (outside / "theirs.json").exists()
    assert (land / "ext").is_symlink()
    assert not (land / "own.json").exists()


def test_file_link_to_outside_is_not_read_nor_deleted(tmp_path: Path) -> None:
    land, outside = tmp_path / "land", tmp_path / "outside"
    write_json(land, "own.json", [{"id": 1}])
    secret = write_json(outside, "secret.json", [{"id": 99}])
    os.symlink(secret, land / "b.json")
    run(land, tmp_path / "out", tmp_path / "chk",
        **opts(tmp_path, **{"cloudFiles.cleanSource": "DELETE", "cloudFiles.cleanSource.retentionDuration": "0s"}))  # fmt: skip
    assert ids(tmp_path / "out") == [1]
    assert secret.exists() and (land / "b.json").is_symlink()


def test_link_loop_ingests_each_file_once(tmp_path: Path) -> None:
    land = tmp_path / "land"
    write_json(land, "a.json", [{"id": 1}])
    write_json(land, "sub/b.json", [{"id": 2}])
    os.symlink(land, land / "loop")
    os.symlink(land / "sub", land / "sub" / "again")
    run(land, tmp_path / "out", tmp_path / "chk", **opts(tmp_path))
    assert ids(tmp_path / "out") == [1, 2]


def test_the_load_path_itself_may_be_a_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write_json(real, "a.json", [{"id": 1}])
    os.symlink(real, tmp_path / "land")
    run(tmp_path / "land", tmp_path / "out", tmp_path / "chk", **opts(tmp_path))
    assert ids(tmp_path / "out") == [1]


def test_folder_swapped_for_a_link_after_listing_is_not_touched(tmp_path: Path) -> None:
    """Between listing and clean-up a folder is replaced by a link to another folder holding a
    file of the same name: delete, move and open all refuse it."""
    land, outside, archive = tmp_path / "land", tmp_path / "outside", tmp_path / "archive"
    write_json(land, "day/a.json", [{"id": 1}])
    write_json(outside, "a.json", [{"id": 99}])
    store = LocalStore(str(land))
    assert [f.rel for f in store.list()] == ["day/a.json"]
    os.rename(land / "day", tmp_path / "moved-away")
    os.symlink(outside, land / "day")
    with pytest.raises(NotARegularFileError, match="symbolic link"):
        store.delete("day/a.json")
    with pytest.raises(NotARegularFileError, match="symbolic link"):
        store.move("day/a.json", str(archive))
    with pytest.raises(NotARegularFileError, match="symbolic link"):
        store.open("day/a.json")
    assert store.stat("day/a.json") is None
    assert (outside / "a.json").exists() and not archive.exists()


def test_file_swapped_for_a_link_is_not_deleted_through_it(tmp_path: Path) -> None:
    land, outside = tmp_path / "land", tmp_path / "outside"
    write_json(land, "a.json", [{"id": 1}])
    secret = write_json(outside, "a.json", [{"id": 99}])
    store = LocalStore(str(land))
    os.unlink(land / "a.json")
    os.symlink(secret, land / "a.json")
    with pytest.raises(NotARegularFileError, match="symbolic link"):
        store.delete("a.json")
    with pytest.raises(NotARegularFileError):
        store.open("a.json")
    assert secret.exists() and (land / "a.json").is_symlink()


def test_dot_dot_is_refused(tmp_path: Path) -> None:
    (tmp_path / "land").mkdir()
    write_json(tmp_path, "x.json", [{"id": 1}])
    store = LocalStore(str(tmp_path / "land"))
    with pytest.raises(NotARegularFileError):
        store.delete("../x.json")
    assert (tmp_path / "x.json").exists()

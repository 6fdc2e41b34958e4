"""cleanSource: MOVE / DELETE of files whose batch is committed, after the retention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.plugins.cloudfiles.helpers import output, run, write_json


def opts(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.schemaLocation": str(tmp_path / "schema"), **more}  # fmt: skip


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_move_keeps_relative_paths_and_never_reingests(tmp_path: Path) -> None:
    src, out, chk, archive = tmp_path / "in", tmp_path / "out", tmp_path / "chk", tmp_path / "archive"
    write_json(src, "a.json", [{"id": 1}])
    write_json(src, "day=1/b.json", [{"id": 2}])
    write_json(src, "c.json", [{"id": 3}])
    more = {"cloudFiles.cleanSource": "MOVE", "cloudFiles.cleanSource.moveDestination": str(archive),
            "cloudFiles.cleanSource.retentionDuration": "0 seconds", "cloudFiles.maxFilesPerTrigger": 2,
            "cloudFiles.partitionColumns": ""}  # fmt: skip
    run(src, out, chk, **opts(tmp_path, **more))
    assert files_under(archive) == ["a.json", "c.json", "day=1/b.json"]
    assert files_under(src) == []
    write_json(src, "a.json", [{"id": 4}])  # the same name again is deduplicated (no allowOverwrites)
    write_json(src, "d.json", [{"id": 5}])
    run(src, out, chk, **opts(tmp_path, **more))
    assert sorted(output(out).column("id").to_pylist()) == [1, 2, 3, 5]
    assert files_under(archive) == ["a.json", "c.json", "d.json", "day=1/b.json"]
    assert files_under(src) == ["a.json"]


def test_retention_not_elapsed_leaves_files(tmp_path: Path) -> None:
    src, archive = tmp_path / "in", tmp_path / "archive"
    write_json(src, "a.json", [{"id": 1}])
    run(src, tmp_path / "out", tmp_path / "chk", **opts(tmp_path, **{
        "cloudFiles.cleanSource": "MOVE", "cloudFiles.cleanSource.moveDestination": str(archive)}))  # default 30 days
    assert files_under(src) == ["a.json"] and not archive.exists()


def test_delete_after_commit(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_json(src, "a.json", [{"id": 1}])
    write_json(src, "b.json", [{"id": 2}])
    (src / "_keep.txt").write_text("hidden files are not ingested, so never cleaned")
    run(src, tmp_path / "out", tmp_path / "chk", **opts(tmp_path, **{
        "cloudFiles.cleanSource": "DELETE", "cloudFiles.cleanSource.retentionDuration": "0s"}))  # fmt: skip
    assert files_under(src) == ["_keep.txt"]
    assert sorted(output(tmp_path / "out").column("id").to_pylist()) == [1, 2]

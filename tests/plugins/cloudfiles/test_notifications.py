"""File-event mode (cloudFiles.useNotifications) with watchdog, and backfill listings."""

from __future__ import annotations

from pathlib import Path

import headrace as hr
from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext
from headrace.testing import wait_for
from tests.plugins.cloudfiles.helpers import write_json


def test_files_arriving_are_picked_up_from_events(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_json(src, "before.json", [{"id": 0}])  # present at start: found by the initial full listing
    q = (
        hr.read_stream.format("cloudFiles")
        .options({"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
                  "cloudFiles.schemaLocation": str(tmp_path / "s"), "cloudFiles.useNotifications": "true"})
        .load(str(src)).write_stream.format("memory").query_name("cf_events")
        .option("checkpointLocation", str(tmp_path / "chk")).start()
    )  # fmt: skip
    try:
        wait_for(lambda: hr.memory_table("cf_events").num_rows == 1, what="the existing file")
        write_json(src, "x/after1.json", [{"id": 1}])
        write_json(src, "after2.json", [{"id": 2}, {"id": 3}])
        (src / "_ignored.json").write_text('{"id": 99}\n')
        wait_for(lambda: hr.memory_table("cf_events").num_rows == 4, what="files created after start")
        assert sorted(hr.memory_table("cf_events").column("id").to_pylist()) == [0, 1, 2, 3]
    finally:
        q.stop()
    assert q.exception() is None


def test_backfill_listing_finds_files_events_missed(tmp_path: Path) -> None:
    spec = registry().get("cloudFiles")

    def source(backfill: str | None) -> object:
        src = tmp_path / f"in-{backfill}"
        write_json(src, "a.json", [{"id": 0}])
        raw = {"path": str(src), "cloudFiles.format": "json", "cloudFiles.schemaLocation": str(tmp_path / "s"),
               "cloudFiles.useNotifications": "true"}  # fmt: skip
        if backfill:
            raw["cloudFiles.backfillInterval"] = backfill
        state = tmp_path / f"state-{backfill}"
        state.mkdir()
        return spec.load_source()(spec.source_options.parse(raw), SourceContext(state_path=str(state)))

    for backfill, expect in ((None, 1), ("0 seconds", 2)):
        s = source(backfill)
        try:
            end = s.latest_offset(s.initial_offset(), ReadLimit.all_available())  # type: ignore[attr-defined]
            assert end == {"seq": 1}
            s._watcher.close()  # type: ignore[attr-defined]  # events stop arriving (a lost event)
            write_json(tmp_path / f"in-{backfill}", "missed.json", [{"id": 1}])
            end = s.latest_offset(end, ReadLimit.all_available())  # type: ignore[attr-defined]
            assert end == {"seq": expect}
        finally:
            s.close()  # type: ignore[attr-defined]

"""The state folder's metadata and its operator description (``operatorSpec``): a stored
description that differs is refused naming each field; a folder written before descriptions
existed is accepted when its schemas match and records the query's description, so that a
later change is refused; a damaged description is a ``CheckpointError``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.errors import CheckpointError
from headrace.state import open_state_store
from headrace.state.metadata import spec_changes

BACKENDS = ["memory", "rocksdb"]
COUNT = {"operator": "aggregate", "groupingKeys": ["k"], "window": None, "aggregates": ["count(*)"], "eventTime": None}
SUM = {**COUNT, "aggregates": ["sum(value)"]}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _open(backend: str, path: Path, spec: dict[str, Any] | None, description: str = "aggregate(count)") -> Any:
    return open_state_store(backend, str(path), pa.schema([("k", pa.int64())]), pa.schema([("p0", pa.int64())]),
                            description=description, operator_spec=spec)  # fmt: skip


def _write_one_version(backend: str, path: Path, spec: dict[str, Any] | None) -> None:
    s = _open(backend, path, spec)
    s.load(-1)
    s.put(pa.table({"k": [1, 2]}), pa.table({"p0": [5, 6]}))
    s.commit(0)
    s.close()


def _meta(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "metadata").read_text()))


def test_a_changed_description_is_refused_naming_the_field(backend: str, tmp_path: Path) -> None:
    _write_one_version(backend, tmp_path, COUNT)
    assert _meta(tmp_path)["operatorSpec"] == COUNT
    with pytest.raises(CheckpointError, match=r"aggregates: \[count\(\*\)\] before, \[sum\(value\)\] now") as e:
        _open(backend, tmp_path, SUM)
    assert str(tmp_path) in str(e.value) and "new checkpointLocation" in str(e.value)
    s = _open(backend, tmp_path, COUNT)  # the same query still opens it
    s.load(0)
    assert len(s) == 2
    s.close()


def test_state_without_a_description_is_accepted_and_records_it(
    backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write_one_version(backend, tmp_path, COUNT)
    meta = _meta(tmp_path)
    del meta["operatorSpec"]  # as a folder written before descriptions existed
    (tmp_path / "metadata").write_text(json.dumps(meta))
    with caplog.at_level(logging.INFO, logger="headrace.state.metadata"):
        s = _open(backend, tmp_path, COUNT)
    s.load(0)
    assert len(s) == 2
    s.close()
    assert _meta(tmp_path)["operatorSpec"] == COUNT
    assert "recorded the operator description" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # the same operator text: no warning
    with pytest.raises(CheckpointError, match=r"aggregates: \[count\(\*\)\] before, \[sum\(value\)\] now"):
        _open(backend, tmp_path, SUM)


def test_state_without_a_description_from_another_operator_text_is_used_with_a_warning(
    backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write_one_version(backend, tmp_path, COUNT)
    meta = _meta(tmp_path)
    del meta["operatorSpec"]
    (tmp_path / "metadata").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="headrace.state.metadata"):
        _open(backend, tmp_path, SUM, description="aggregate(sum)").close()
    assert "no operator description" in caplog.text and "aggregate(sum)" in caplog.text
    assert _meta(tmp_path)["operatorSpec"] == SUM


def test_a_store_opened_without_a_description_checks_only_the_schemas(backend: str, tmp_path: Path) -> None:
    _write_one_version(backend, tmp_path, COUNT)
    _open(backend, tmp_path, None).close()  # (a store used outside an operator)
    assert _meta(tmp_path)["operatorSpec"] == COUNT


@pytest.mark.parametrize("bad", [["count(*)"], "count", 3], ids=["list", "string", "number"])
def test_a_damaged_description_is_refused(backend: str, tmp_path: Path, bad: Any) -> None:
    _write_one_version(backend, tmp_path, COUNT)
    meta = _meta(tmp_path)
    meta["operatorSpec"] = bad
    (tmp_path / "metadata").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"metadata is corrupt \(operatorSpec is .*, not an object\)"):
        _open(backend, tmp_path, COUNT)


def test_metadata_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"metadata is corrupt \(a JSON list, not an object\)"):
        _open("memory", tmp_path, COUNT)


def test_spec_changes_lists_every_changed_field() -> None:
    old = {"operator": "aggregate", "window": "window(ts, duration 5s, slide 5s, start 0s)", "eventTime": None,
           "outputMode": "append"}  # fmt: skip
    new = {"operator": "aggregate", "window": "window(ts, duration 10s, slide 10s, start 0s)", "eventTime": "ts",
           "groupingKeys": ["a", "b"]}  # fmt: skip
    assert spec_changes(old, new) == [
        "window: window(ts, duration 5s, slide 5s, start 0s) before, window(ts, duration 10s, slide 10s, start 0s) now",
        "eventTime: none before, ts now",
        "outputMode: append before, none now",
        "groupingKeys: none before, [a, b] now",
    ]
    assert spec_changes(old, dict(old)) == []

"""The engine's writer options (``checkpointFsync``, ``stateStore``, ``stateSnapshotInterval``):
accepted by every sink (they never reach its option schema), refused with ``OptionsError``
before any I/O when a value is bad (all problems at once), and ``stateSnapshotInterval``
reaching the stateful operators' state stores: it decides which versions are snapshotted."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pytest

import headrace as hr
from headrace.api.writer import parse_engine_options
from headrace.cli.flow_file import load_flow_file
from headrace.errors import OptionsError
from headrace.testing import memory_stream, wait_for
from tests.core.test_hostile_options import HOSTILE

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])
SINKS = ["memory", "delta", "files"]


def _start(sink: str, tmp_path: Path, options: dict[str, Any], frame_of: Callable[[hr.StreamFrame], hr.StreamFrame],
           mode: str = "append", name: str | None = None) -> hr.StreamingQuery:  # fmt: skip
    name = name or f"eo-{uuid.uuid4().hex[:8]}"
    memory_stream(name, SCHEMA)
    frame = frame_of(hr.read_stream.format("memory").option("name", name).load())
    w = (frame.write_stream.format(sink).query_name(name).output_mode(mode)
         .option("checkpointLocation", str(tmp_path / "chk")).options(options)
         .trigger(processing_time="10 milliseconds"))  # fmt: skip
    return w.start(None if sink == "memory" else str(tmp_path / "out"))


def _batches(q: hr.StreamingQuery, n: int, *, same_users: bool, tmp_path: Path, due: list[int]) -> None:
    """``n`` batches; after each, wait for the snapshot it started when one is ``due`` (a
    memory-backend snapshot due while the previous one is still being written is put off, which
    a loaded machine could otherwise make happen)."""
    stream = memory_stream(q.name)
    try:
        for b in range(n):
            users = ["a", "b", "c"] if same_users else [f"u{b}-{i}" for i in range(3)]
            stream.add(pa.table({"user": users, "n": [b, b, b]}, schema=SCHEMA))
            q.process_all_available(60)
            if b - 1 in due:  # batch b loaded version b - 1, which started its snapshot
                wait_for(cast(Callable[[], bool], lambda v=b - 1: v in _snapshots(tmp_path)),
                         timeout=60, what=f"snapshot {b - 1}")
    finally:
        q.stop()
    assert q.exception() is None, q.exception()


def _snapshots(tmp_path: Path) -> list[int]:
    """The versions of the operator's snapshots (``<n>``, or ``<n>.rocksdb``; no temporaries)."""
    folder = tmp_path / "chk" / "state" / "0" / "snapshot"
    names = [p.name.removesuffix(".rocksdb") for p in folder.iterdir()] if folder.exists() else []
    return sorted(int(n) for n in names if n.isdigit())


def _expected(versions: int, interval: int) -> list[int]:
    """Versions interval-1, 2*interval-1, ...: each is snapshotted when the next batch loads it,
    so the last version is not."""
    return [v for v in range(interval - 1, versions - 1, interval)]


BAD = [(0, "minimum 1"), (-1, "minimum 1"), ("-3", "minimum 1"), (2.5, "not an integer"), ("2.5", "not an integer"),
       ("ten", "not an integer"), ("", "not an integer"), (True, "not an integer"), ("1e3", "not an integer"),
       (2**63, "maximum"), ("\x00", "not an integer")]  # fmt: skip


@pytest.mark.parametrize("sink", SINKS)
@pytest.mark.parametrize(("value", "why"), BAD, ids=[repr(v) for v, _ in BAD])
def test_a_bad_state_snapshot_interval_is_refused_before_any_io(sink: str, value: Any, why: str, tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match=f"stateSnapshotInterval: .*{why}.*at least 1") as e:
        _start(sink, tmp_path, {"stateSnapshotInterval": value}, lambda s: s.drop_duplicates("user"))
    assert "unknown option" not in str(e.value)
    assert not (tmp_path / "chk").exists() and not (tmp_path / "out").exists()


def test_every_bad_engine_option_is_named_at_once(tmp_path: Path) -> None:
    with pytest.raises(OptionsError) as e:
        _start("delta", tmp_path, {"stateSnapshotInterval": 0, "stateStore": "redis", "checkpointFsync": "maybe",
                                   "mergeSchema": "perhaps"}, lambda s: s.drop_duplicates("user"))  # fmt: skip
    assert [p.option for p in e.value.problems] == ["checkpointFsync", "stateStore", "stateSnapshotInterval",
                                                    "mergeSchema"]  # fmt: skip
    assert not (tmp_path / "chk").exists()


@pytest.mark.parametrize("sink", SINKS)
def test_state_snapshot_interval_is_accepted_and_reaches_the_state_store(sink: str, tmp_path: Path) -> None:
    # RocksDB snapshots every stateSnapshotInterval changelogs (the memory backend also waits
    # for enough changed rows: see the next test)
    q = _start(sink, tmp_path, {"stateSnapshotInterval": "2", "stateStore": "rocksdb"},
               lambda s: s.drop_duplicates("user"))  # fmt: skip
    _batches(q, 6, same_users=False, tmp_path=tmp_path, due=_expected(6, 2))
    assert _snapshots(tmp_path) == _expected(6, 2) == [1, 3]


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
@pytest.mark.parametrize("interval", [1, 2, 3, None], ids=["1", "2", "3", "default-10"])
def test_the_interval_decides_which_versions_are_snapshotted(backend: str, interval: int | None, tmp_path: Path) -> None:
    options: dict[str, Any] = {"stateStore": backend}
    if interval is not None:
        options["stateSnapshotInterval"] = interval
    q = _start("memory", tmp_path, options, lambda s: s.group_by("user").agg("sum(n) AS total"), mode="update")
    # every batch changes every key: the memory backend's row rule holds
    _batches(q, 8, same_users=True, tmp_path=tmp_path, due=_expected(8, interval or 10))
    assert _snapshots(tmp_path) == _expected(8, interval or 10)


def test_a_pipeline_file_with_a_bad_interval_fails_validation(tmp_path: Path) -> None:
    p = tmp_path / "p.toml"
    p.write_text('checkpoint = "c"\n[source]\nformat = "rate-micro-batch"\noptions = { rowsPerBatch = 1 }\n'
                 '[sink]\nformat = "noop"\noptions = { stateSnapshotInterval = 0, checkpointFsync = false }\n')  # fmt: skip
    with pytest.raises(OptionsError, match=r"sink\.stateSnapshotInterval: 0 is less than the minimum 1"):
        load_flow_file(str(p)).validate()
    assert not (tmp_path / "c").exists()
    p.write_text(p.read_text().replace("stateSnapshotInterval = 0", "stateSnapshotInterval = 5"))
    load_flow_file(str(p)).validate()


@pytest.mark.parametrize("value", HOSTILE, ids=[f"hostile-{i}" for i in range(len(HOSTILE))])
def test_every_hostile_interval_parses_to_a_positive_int_or_is_a_problem(value: Any) -> None:
    parsed, problems = parse_engine_options({"stateSnapshotInterval": value})
    if problems:
        assert [p.option for p in problems] == ["stateSnapshotInterval"]
        assert parsed.state_snapshot_interval == 10
    else:
        assert type(parsed.state_snapshot_interval) is int and parsed.state_snapshot_interval >= 1


HELD_BAD = [(-1, "minimum 0"), ("2.5", "not an integer"), ("lots", "not an integer"), (True, "not an integer")]


@pytest.mark.parametrize(("value", "why"), HELD_BAD, ids=[repr(v) for v, _ in HELD_BAD])
def test_a_bad_rocksdb_held_keys_mb_is_refused_before_any_io(value: Any, why: str, tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match=f"rocksdbHeldKeysMB: .*{why}.*0 or more") as e:
        _start("delta", tmp_path, {"rocksdbHeldKeysMB": value, "stateStore": "rocksdb"},
               lambda s: s.drop_duplicates("n"))  # fmt: skip
    assert "unknown option" not in str(e.value)
    assert not (tmp_path / "chk").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(("value", "held"), [(None, True), ("0", False)], ids=["default", "none-held"])
def test_rocksdb_held_keys_mb_reaches_the_deduplication_state(value: Any, held: bool, tmp_path: Path) -> None:
    """A deduplication's RocksDB state holds its new keys in memory by default; with
    ``rocksdbHeldKeysMB`` 0 it writes every batch's keys to its database."""
    options: dict[str, Any] = {"stateStore": "rocksdb"}
    if value is not None:
        options["rocksdbHeldKeysMB"] = value
    q = _start("memory", tmp_path, options, lambda s: s.drop_duplicates("n"))
    stream = memory_stream(q.name)
    try:
        stream.add(pa.table({"user": ["a", "b"], "n": [1, 2]}, schema=SCHEMA))
        q.process_all_available(60)
        store = q._run.runner.operators[0].store  # type: ignore[union-attr]
        assert (store._held_keys is not None) == held and len(store) == 2
    finally:
        q.stop()
    assert q.exception() is None, q.exception()

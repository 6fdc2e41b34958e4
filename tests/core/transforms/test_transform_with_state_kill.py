"""rate-micro-batch -> with_watermark -> transform_with_state with event-time timers -> Delta,
SIGKILLed at every engine crash point and at random moments, for both state stores: the table
holds exactly the rows of a run that was never killed, each once."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.testing import CRASH_POINTS, run_pipeline, run_until_done

deltalake = pytest.importorskip("deltalake")

PER_BATCH = 40
BATCHES = 36
START_MS = 1_700_000_000_000
ADVANCE_MS = 1_000
DELAY_S = 1
ROTATION = 6  # a key gets rows every 6th batch; its timer (2 s after its last row) fires in between


class Burst(hr.StatefulProcessor):
    """Per key: the rows since the last alert (value state), their sum (map state by parity),
    their values (list state); an event-time timer 2 s after the key's latest row; when it
    fires, one alert row with what was gathered, and the state is cleared."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.n = handle.get_value_state("n", "n BIGINT, last BIGINT")
        self.sums = handle.get_map_state("sums", "parity BIGINT", "total BIGINT")
        self.values = handle.get_list_state("values", "v BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        n, last = self.n.get() or (0, 0)
        ts = max(int(t.timestamp() * 1000) for t in rows.column("timestamp").to_pylist())
        if n:
            self.handle.delete_timer(last + 2_000)
        last = max(last, ts)
        vs = rows.column("value").to_pylist()
        self.n.update((n + len(vs), last))
        for v in vs:
            p = (v % 2,)
            self.sums.update_value(p, ((self.sums.get_value(p) or (0,))[0] + v,))
        self.values.append_list([(v,) for v in vs])
        self.handle.register_timer(last + 2_000)
        return iter(())

    def handle_expired_timer(
        self, key: tuple[Any, ...], tv: hr.TimerValues, info: hr.ExpiredTimerInfo
    ) -> Iterator[Any]:
        n, _ = self.n.get() or (0, 0)
        sums = dict((k[0], v[0]) for k, v in self.sums.iterator())
        values = sorted(v for (v,) in self.values.get())
        for s in (self.n, self.sums, self.values):
            s.clear()
        yield {"k": key[0], "fired": info.expiry_time_ms - START_MS, "n": n, "even": sums.get(0, 0),
               "odd": sums.get(1, 0), "first": values[0] if values else -1}  # fmt: skip


def alerts(stream: Any) -> Any:
    """The pipeline's plan (loaded by the subprocess runner)."""
    return (stream.with_watermark("timestamp", f"{DELAY_S} seconds")
            .with_column("k", f"((value // {PER_BATCH}) % {ROTATION}) * 10 + value % 2")
            .group_by("k")
            .transform_with_state(Burst(), "k BIGINT, fired BIGINT, n BIGINT, even BIGINT, odd BIGINT, first BIGINT",
                                  "append", "event_time"))  # fmt: skip


def _spec(tmp_path: Path, name: str, backend: str) -> dict[str, Any]:
    return {
        "source": {"format": "rate-micro-batch",
                   "options": {"rowsPerBatch": PER_BATCH, "totalRows": PER_BATCH * BATCHES, "numPartitions": 2,
                               "startTimestamp": START_MS, "advanceMillisPerBatch": ADVANCE_MS}},
        "frame": f"{__name__}:alerts",
        "sink": {"format": "delta", "options": {"path": str(tmp_path / name / "out"), "stateStore": backend}},
        "checkpoint": str(tmp_path / name / "chk"),
        "name": f"tws-{name}",
        "output_mode": "append",
        "trigger": {"available_now": True},
    }  # fmt: skip


def _rows(spec: dict[str, Any]) -> list[tuple[Any, ...]]:
    t = deltalake.DeltaTable(spec["sink"]["options"]["path"]).to_pyarrow_table()
    return [tuple(r.values()) for r in t.to_pylist()]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_timers_to_delta_exactly_once_across_kills(tmp_path: Path, backend: str) -> None:
    reference = _spec(tmp_path, "reference", backend)
    run_until_done(reference, timeout=180)
    want = _rows(reference)
    assert len(want) > BATCHES, "the reference run fired too few timers to test anything"
    spec = _spec(tmp_path, "killed", backend)
    crashes = ["before_offsets:0", *(f"{p}:{3 * i + 2}" for i, p in enumerate(CRASH_POINTS))]
    results = run_until_done(
        spec, crashes=crashes, random_kills=2, kill_window=(1.0, 2.5), seed=29, timeout=180
    )
    killed = sum(r.killed for r in results[: len(crashes)])
    assert killed == len(crashes), [r.stderr[-800:] for r in results if not r.killed]
    got = _rows(spec)
    dup = [r for r, n in Counter(got).items() if n > 1]
    assert not dup, f"alerts written more than once: {dup[:5]}"
    assert sorted(got) == sorted(want)
    # every alert holds the rows of one burst of its key: 20 rows (half a batch)
    assert {r[2] for r in got} == {PER_BATCH // 2}


def _committed(spec: dict[str, Any]) -> int:
    commits = Path(spec["checkpoint"]) / "commits"
    return sum(1 for f in commits.iterdir() if f.name.isdigit()) if commits.is_dir() else 0


def _kill_at_random_moments(tmp_path: Path, backend: str, kills: int, seed: int) -> list[str]:
    """A reference run (traced: when its first batch starts, how long the batches take), then
    runs SIGKILLed from outside at a random moment of what is left of the work, until
    ``kills`` runs died by SIGKILL (a run that finishes first ends the loop; with no kill landed
    yet, the kills start again on a fresh checkpoint and table, up to three times), then a run
    to the end: the table holds the reference's rows, each once."""
    reference = _spec(tmp_path, "reference", backend)
    ref = run_pipeline(reference, trace=True, timeout=180).check()
    assert ref.trace, "the reference run passed no crash point"
    start = ref.trace[0].at  # the first batch starts here: interpreter and imports before
    span = ref.elapsed - start
    total = _committed(reference)
    want = _rows(reference)
    rng = random.Random(seed)
    killed: list[str] = []
    # a run faster than the reference (the machine's load changes) can finish before its kill
    for attempt in range(3):
        spec = _spec(tmp_path, f"killed-{attempt}", backend)
        for _ in range(3 * kills):
            left = 1 - _committed(spec) / total
            r = run_pipeline(spec, kill_after=start + rng.uniform(0, span * left), trace=True, timeout=180)
            if not r.killed:
                r.check()
                break
            killed.append(r.last_point())
            if len(killed) == kills:
                break
        if killed:
            break
    assert killed, "no run was killed mid-way in three attempts: the kills test nothing"
    run_pipeline(spec, timeout=180).check()
    got = _rows(spec)
    dup = [r for r, n in Counter(got).items() if n > 1]
    assert not dup, f"alerts written more than once (kills {killed}): {dup[:5]}"
    assert sorted(got) == sorted(want), f"kills {killed}"
    return killed


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_timers_to_delta_exactly_once_across_random_kills(tmp_path: Path, backend: str) -> None:
    _kill_at_random_moments(tmp_path, backend, kills=2, seed=41 if backend == "memory" else 43)


@pytest.mark.deep
@pytest.mark.timeout(1800)  # ten runs of the pipeline, each a fresh interpreter
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_timers_to_delta_exactly_once_across_many_random_kills(
    tmp_path: Path, backend: str, seed: int
) -> None:
    killed = _kill_at_random_moments(tmp_path, backend, kills=8, seed=seed)
    assert len(killed) >= 4, f"only {len(killed)} runs were killed mid-way: {killed}"


class Stamp(hr.StatefulProcessor):
    """Emits, per key and batch, the batch's processing time."""

    def init(self, handle: hr.StatefulProcessorHandle) -> None:
        self.n = handle.get_value_state("n", "n BIGINT")

    def handle_input_rows(self, key: tuple[Any, ...], rows: pa.Table, tv: hr.TimerValues) -> Iterator[Any]:
        self.n.update(((self.n.get() or (0,))[0] + rows.num_rows,))
        yield (key[0], tv.current_processing_time_ms)


def stamped(stream: Any) -> Any:
    return (stream.with_column("k", "value % 3").group_by("k")
            .transform_with_state(Stamp(), "k BIGINT, now BIGINT", "append", "processing_time"))  # fmt: skip


@pytest.mark.slow
def test_a_replayed_batch_has_the_processing_time_its_offsets_record(tmp_path: Path) -> None:
    """A batch killed before its sink committed is replayed with the timestamp its offsets
    entry recorded, so processing-time timers and TTLs see the same time."""
    import json

    spec = _spec(tmp_path, "stamped", "memory")
    spec["frame"] = f"{__name__}:stamped"
    results = run_until_done(spec, crashes=["before_sink_commit:2", "mid_write:4"], timeout=180)
    assert sum(r.killed for r in results[:2]) == 2, [r.stderr[-800:] for r in results if not r.killed]
    recorded = set()
    for f in (tmp_path / "stamped" / "chk" / "offsets").iterdir():
        if f.name.isdigit():
            text = f.read_text()
            doc = json.loads(text[text.index("{") :].splitlines()[0]) if "{" in text else {}
            recorded.add(int(doc["timestamp"]))
    stamps = {r[1] for r in _rows(spec)}
    assert stamps and stamps <= recorded, sorted(stamps - recorded)

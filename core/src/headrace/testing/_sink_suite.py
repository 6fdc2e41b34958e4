"""The sink contract suite (see :mod:`headrace.testing.contract`)."""

from __future__ import annotations

import pickle
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest

from headrace.plugins import registry
from headrace.protocols import Sink, SinkContext
from headrace.testing._checks import (
    COMMIT_STEP_KILLS,
    SINK_KILLS,
    _discovered,
    _typo_rejected,
    baseline_batches,
    kill_marks,
    picklable,
    run_kills,
)
from headrace.testing._kills import landed, seed_note
from headrace.testing._pipeline import _load, run_pipeline

__all__ = ["InjectedFault", "SinkContract"]


class InjectedFault(Exception):
    """The contract kit's own fault, which a ``commit_fault`` fixture makes the sink's client raise."""


def _caused_by(error: BaseException, fault: BaseException) -> bool:
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        if e is fault:
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


class SinkContract:
    """Subclass with ``connector`` and fixtures ``sink_options`` and ``read_back``.

    The input is ``rate-micro-batch`` rows ``(timestamp, value int64)``, passed through
    ``transform`` (``"module:function"``, Table -> Table) when set. ``read_back()`` returns the
    ``value`` ints the sink holds. ``supports_abort`` is False for sinks whose written rows
    cannot be taken back (at-least-once sinks). ``one_query_per_target`` is True for sinks whose
    target takes one query's batches only (the files sink, like Spark's).

    Optional fixture ``commit_fault``: a function ``arm(fault)`` after which the sink's client
    raises ``fault`` from its next call (the one that writes rows or the idempotency record);
    without it the fault test is skipped.
    """

    connector: ClassVar[str] = ""
    transform: ClassVar[str | None] = None
    supports_abort: ClassVar[bool] = True
    output_mode: ClassVar[str] = "append"
    kill_rows: ClassVar[int] = 2000
    kill_rows_per_batch: ClassVar[int] = 400
    kill_timeout: ClassVar[float] = 120.0
    random_kills: ClassVar[int] = 3
    one_query_per_target: ClassVar[bool] = False

    # -------------------------------------------------------------- helpers
    def rows(self, lo: int, hi: int) -> pa.Table:
        from headrace.connectors.rate import SCHEMA

        ts = pa.array([i * 1000 for i in range(lo, hi)], pa.int64()).cast(SCHEMA.field("timestamp").type)
        table = pa.Table.from_arrays([ts, pa.array(range(lo, hi), pa.int64())], schema=SCHEMA)
        if self.transform:
            table = _load(self.transform)(table)
        return table

    def make_sink(self, options: dict[str, Any], state: Path, query_id: str = "contract-query") -> Sink:
        spec = registry().get(self.connector)
        opts = spec.sink_options.parse(options, connector=spec.name, role="sink")
        state.mkdir(parents=True, exist_ok=True)
        ctx = SinkContext(query_id=query_id, run_id=uuid.uuid4().hex, query_name="contract",
                          output_mode=self.output_mode, state_path=str(state), schema=self.rows(0, 1).schema)  # fmt: skip
        sink: Sink = spec.load_sink()(opts, ctx)
        return sink

    def idempotent(self) -> bool:
        return bool(getattr(registry().get(self.connector).load_sink(), "idempotent_commit", False))

    def write_commit(self, sink: Sink, batch_id: int, lo: int, hi: int) -> None:
        msg = sink.write(batch_id, iter(self.rows(lo, hi).to_batches(max_chunksize=max(1, (hi - lo) // 3 or 1))))
        picklable(msg, f"the commit message of write({batch_id})", "commit may run in another process (under Spark)")
        sink.commit(batch_id, [msg])

    def assert_values(self, got: list[int], expected: range | list[int], *, exactly_once: bool, context: str = "") -> None:
        counts = Counter(got)
        where = f"{context}: " if context else ""
        missing = [v for v in expected if counts[v] == 0]
        assert not missing, f"{where}{len(missing)} values missing, e.g. {missing[:10]}"
        if exactly_once:
            dup = [v for v, n in counts.items() if n > 1]
            assert not dup, f"{where}{len(dup)} values written more than once, e.g. {sorted(dup)[:10]}"
            extra = set(counts) - set(expected)
            assert not extra, f"{where}unexpected values {sorted(extra)[:10]}"

    # -------------------------------------------------------------- tests
    def test_discovered_through_entry_point(self) -> None:
        _discovered(self.connector)
        assert registry().get(self.connector).sink is not None

    def test_unknown_options_rejected_with_suggestion(self, sink_options: dict[str, Any]) -> None:
        spec = registry().get(self.connector)
        names = [o.name for o in spec.sink_options.options if not o.unsupported]
        _typo_rejected(names, lambda o: spec.sink_options.parse(o, connector=spec.name, role="sink"), sink_options)

    def test_write_then_commit(self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(sink, 0, 0, 10)
        sink.close()
        self.assert_values(read_back(), range(10), exactly_once=True, context="write() then commit() of batch 0")

    def test_rows_invisible_until_commit(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        if not self.supports_abort:
            pytest.skip("at-least-once sink (supports_abort = False): rows may become visible in write()")
        sink = self.make_sink(sink_options, tmp_path / "s")
        msg = sink.write(0, iter(self.rows(0, 10).to_batches()))
        early = read_back()
        if early:
            raise AssertionError(
                f"rows written before commit: {len(early)} rows were visible after write() and before commit(); "
                "write() must only stage (a crash before commit would leave them, and abort could not take them "
                "back). Stage them, return what commit needs in the message, and make them visible in commit(); "
                "or, for an at-least-once sink, set supports_abort = False in the test class"
            )
        sink.commit(0, [msg])
        sink.close()
        self.assert_values(read_back(), range(10), exactly_once=True, context="commit() after write()")

    def test_recommitting_a_batch_does_not_duplicate(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        first = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(first, 0, 0, 10)
        if self.idempotent():
            self.write_commit(first, 0, 0, 10)  # the same run commits batch 0 again
            dup = [v for v, k in Counter(read_back()).items() if k > 1]
            if dup:
                raise AssertionError(
                    f"replay not skipped: committing batch 0 a second time wrote its rows again ({len(dup)} values "
                    "twice); an idempotent_commit sink must record the batch ids it committed (keyed by "
                    "context.query_id) and skip a batch id it has already committed"
                )
        first.close()
        again = self.make_sink(sink_options, tmp_path / "s")  # a restarted query (same query_id, new run_id)
        self.write_commit(again, 0, 0, 10)
        again.close()
        got = read_back()
        if self.idempotent() and any(k > 1 for k in Counter(got).values()):
            raise AssertionError(
                "bookkeeping keyed by the run: re-committing batch 0 from a restarted run of the same query "
                "(same context.query_id, new context.run_id) wrote its rows again, although re-committing from the "
                "same run did not; key the record of committed batches by context.query_id and the batch id, never "
                "by run_id (it changes at every restart)"
            )
        self.assert_values(got, range(10), exactly_once=self.idempotent(), context="batch 0 committed by two runs")

    def test_several_writers_one_commit(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        # as under Spark: one writer per task, then commit on a fresh instance
        msgs = []
        for lo, hi in ((0, 5), (5, 12)):
            w = self.make_sink(sink_options, tmp_path / "s")
            msg = w.write(0, iter(self.rows(lo, hi).to_batches()))
            picklable(msg, "a commit message", "under Spark, write() runs in an executor and commit() on the driver")
            msgs.append(pickle.loads(pickle.dumps(msg)))
            w.close()
        committer = self.make_sink(sink_options, tmp_path / "s")
        committer.commit(0, msgs)
        committer.close()
        got = read_back()
        if sorted(set(got)) == list(range(5)):
            raise AssertionError(
                "only the first writer's message committed: commit(0, messages) got the messages of 2 writers "
                "(rows 0-4 and 5-11, as two Spark tasks send) but made only the first one's rows visible; commit "
                "must apply every message"
            )
        self.assert_values(got, range(12), exactly_once=True, context="two writers, one commit")

    def test_abort_discards_the_batch(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(sink, 0, 0, 5)
        msg = sink.write(1, iter(self.rows(100, 110).to_batches()))
        sink.abort(1, [msg])
        sink.close()
        got = read_back()
        self.assert_values(got, range(5), exactly_once=self.supports_abort, context="batch 0 committed, batch 1 aborted")
        if self.supports_abort:
            assert not set(got) & set(range(100, 110)), "aborted rows became visible: abort() must discard what write() staged"

    def test_empty_batch(self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(sink, 0, 0, 3)
        sink.commit(1, [sink.write(1, iter([]))])
        sink.close()
        self.assert_values(read_back(), range(3), exactly_once=True, context="an empty batch 1 after batch 0")

    def test_close_is_idempotent(self, sink_options: dict[str, Any], tmp_path: Path) -> None:
        sink = self.make_sink(sink_options, tmp_path / "s")
        sink.close()
        sink.close()

    def test_two_queries_into_one_target_both_land(
        self, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        """Two queries (two query ids) write the same batch ids into one target: both land in full."""
        if self.one_query_per_target:
            pytest.skip("one_query_per_target = True: the sink's target takes the batches of one query only")
        a = self.make_sink(sink_options, tmp_path / "a", query_id="contract-query-A")
        b = self.make_sink(sink_options, tmp_path / "b", query_id="contract-query-B")
        for batch in (0, 1):
            self.write_commit(a, batch, 10 * batch, 10 * batch + 10)
            self.write_commit(b, batch, 100 + 10 * batch, 110 + 10 * batch)
        a.close()
        b.close()
        got = Counter(read_back())
        for batch in (0, 1):
            if not any(got[v] for v in range(100 + 10 * batch, 110 + 10 * batch)) and any(
                got[v] for v in range(10 * batch, 10 * batch + 10)
            ):
                raise AssertionError(
                    f"query B's batch {batch} was skipped because query A committed batch {batch}: the idempotency "
                    "record must include the query id (key committed batches by context.query_id and the batch id); "
                    "or, if the target can only ever take one query's batches, set one_query_per_target = True"
                )
        self.assert_values(list(got.elements()), [*range(20), *range(100, 120)], exactly_once=True,
                           context="queries A and B both committed batches 0 and 1 into one target")  # fmt: skip

    def test_a_failed_commit_fails_and_its_replay_lands_once(
        self, request: pytest.FixtureRequest, sink_options: dict[str, Any], read_back: Callable[[], list[int]],
        tmp_path: Path,
    ) -> None:  # fmt: skip
        """With the optional ``commit_fault`` fixture (``arm(fault)``: the sink's client raises
        ``fault`` from its next call), commit must fail, or have made the batch visible; a
        restarted query's commit of that batch then writes it exactly once."""
        try:
            arm = request.getfixturevalue("commit_fault")
        except pytest.FixtureLookupError:
            pytest.skip("no commit_fault fixture: define one that makes the sink's client raise a given exception "
                        "from its next call (see contrib.md, section 7, the contract kit)")  # fmt: skip
        sink = self.make_sink(sink_options, tmp_path / "s")
        self.write_commit(sink, 0, 0, 10)
        msg = sink.write(1, iter(self.rows(10, 20).to_batches()))
        fault = InjectedFault("the contract kit's injected fault, raised from inside the sink's client call")
        arm(fault)
        raised: BaseException | None = None
        try:
            sink.commit(1, [msg])
        except BaseException as e:  # the kit's fault, or the sink's error raised from it
            raised = e
        sink.close()
        got = read_back()
        if raised is None and not set(range(10, 20)) <= set(got):
            raise AssertionError(
                "the sink swallowed a failure in commit and reported success: commit(1) returned normally although "
                f"its client raised the kit's fault ({fault}), and batch 1's rows are not in the target (it holds "
                f"{len(got)} values); let the error propagate so the query fails and replays the batch"
            )
        if raised is not None and not _caused_by(raised, fault):
            raise AssertionError(
                f"commit(1) raised {type(raised).__name__}: {raised}, not the kit's injected fault nor an error raised "
                "from it: check that commit_fault arms the client the sink uses, and chain errors (raise ... from e)"
            )
        again = self.make_sink(sink_options, tmp_path / "s")  # the restarted query replays batch 1
        self.write_commit(again, 1, 10, 20)
        again.close()
        self.assert_values(read_back(), range(20), exactly_once=self.idempotent(),
                           context="batch 1 replayed by a restarted query after its commit failed")  # fmt: skip

    # -------------------------------------------------------------- kill tests
    def kill_spec(self, sink_options: dict[str, Any], tmp_path: Path, total: int | None = None) -> dict[str, Any]:
        """The kill tests' pipeline: ``total`` rows (``kill_rows`` by default) of the rate source
        in batches of ``kill_rows_per_batch``, through ``transform``, into the sink; one query
        (its checkpoint) however often it is run."""
        return {
            # two partitions: each batch reaches the sink as two record batches, so mid_write is hit
            "source": {"format": "rate-micro-batch",
                       "options": {"rowsPerBatch": self.kill_rows_per_batch, "totalRows": total or self.kill_rows,
                                   "numPartitions": 2}},
            "transform": self.transform,
            "sink": {"format": self.connector, "options": sink_options},
            "checkpoint": str(tmp_path / "chk"),
            "name": "contract",
            "output_mode": self.output_mode,
            "trigger": {"available_now": True},
        }  # fmt: skip

    @kill_marks
    @pytest.mark.parametrize("crash", SINK_KILLS)
    def test_kill_and_restart_loses_nothing(
        self, crash: str, sink_options: dict[str, Any], read_back: Callable[[], list[int]], tmp_path: Path
    ) -> None:
        """A kill-free baseline run of ``kill_rows`` rows first (its loss is reported as a loss,
        not blamed on a kill); then the same query goes on over as many rows again (more for
        ``commit-steps``: its kills need 7 batches), through the
        kills and a clean run: every row once (exactly-once sinks), at least once otherwise."""
        n = self.kill_rows
        baseline = run_pipeline(self.kill_spec(sink_options, tmp_path), timeout=self.kill_timeout, trace=True).check()
        first = baseline_batches(baseline)
        self.assert_values(read_back(), range(n), exactly_once=self.idempotent(),
                           context=f"the kill-free baseline run ({first} batches, no kill: the loss is not a kill's)")  # fmt: skip
        more = n if crash != "commit-steps" else max(n, (COMMIT_STEP_KILLS + 4) * self.kill_rows_per_batch)
        spec = self.kill_spec(sink_options, tmp_path, total=n + more)
        runs = run_kills(spec, crash, self.random_kills, self.kill_timeout, batch=first)
        run_pipeline(spec, timeout=self.kill_timeout).check()
        what = f"after SIGKILLs ({landed(runs)}) and a restart"
        if crash == "connector-points":
            what += (": the steps of commit around these crash points are not atomic (e.g. rows and the record "
                     "of the committed batch in separate transactions); commit them in one transaction")  # fmt: skip
        elif crash == "commit-steps":
            what += (": the sink's commit is not atomic across the calls it makes to its client (a kill between two "
                     "of them left a partial batch that the restart could not complete exactly once: e.g. rows "
                     "written in several chunks and the idempotency record with the last one); make the rows and the "
                     "record one transaction, or make every step idempotent")  # fmt: skip
        elif crash == "random-kills":
            what += f" ({seed_note()})"
        self.assert_values(read_back(), range(n + more), exactly_once=self.idempotent(), context=what)

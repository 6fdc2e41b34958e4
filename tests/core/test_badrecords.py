"""The shared bad-record policy (headrace.badrecords) and its settlement by the engine."""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import headrace as hr
from headrace.badrecords import BAD_RECORD_OPTIONS, BadRecord, BadRecords, BadRecordsError, read_dead_letters
from headrace.errors import HeadraceError, OptionsError, StreamingQueryException
from headrace.options import Integer, Option, OptionSchema, String
from headrace.plugins import ConnectorSpec, hookimpl, registry
from headrace.protocols import CommitMessage, Sink, SinkContext


def _records(n: int, start: int = 0) -> list[BadRecord]:
    return [BadRecord(f"file:///in/a.json#record={i}", "malformed json record", f"{{bad {i}") for i in range(start, start + n)]


def test_fail_raises_at_the_first_record_with_where_why_and_the_fix() -> None:
    with pytest.raises(BadRecordsError) as e:
        BadRecords("fail", what="cloudFiles /in").add(_records(3))
    text = str(e.value)
    assert "cloudFiles /in: bad record at file:///in/a.json#record=0: malformed json record (and 2 more)" in text
    assert "{bad 0" in text and "badRecordsPolicy=drop or deadLetter" in text


def test_drop_counts_per_batch_and_in_total() -> None:
    b = BadRecords("drop")
    b.add(_records(2))
    assert b.pending() == 2
    assert b.settle(0, 10, origin="source-0-x") == {"numBadRecords": 2, "numBadRecordsDropped": 2, "numBadRecordsDeadLettered": 0}
    assert b.settle(1, 10, origin="source-0-x")["numBadRecords"] == 0
    assert b.totals["numBadRecordsDropped"] == 2 and b.metrics()["numBadRecords"] == 0


def test_dead_letters_are_one_file_per_batch_replaced_on_replay(tmp_path: Path) -> None:
    b = BadRecords("deadLetter", path=str(tmp_path))
    b.add(_records(12)[::-1])  # any arrival order: the file is sorted
    b.settle(7, 100, origin="source-0-cloudFiles")
    first = (tmp_path / "batch=7" / "source-0-cloudFiles.jsonl").read_bytes()
    b.add(_records(12))  # the replay of batch 7 finds the same records
    b.settle(7, 100, origin="source-0-cloudFiles")
    assert (tmp_path / "batch=7" / "source-0-cloudFiles.jsonl").read_bytes() == first
    letters = read_dead_letters(str(tmp_path))
    assert [x["location"].rsplit("=", 1)[1] for x in letters] == [str(i) for i in range(12)]
    assert letters[0] == {"batchId": 7, "origin": "source-0-cloudFiles", "location": "file:///in/a.json#record=0",
                          "error": "malformed json record", "record": "{bad 0"}  # fmt: skip
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["source-0-cloudFiles.jsonl"]


@pytest.mark.parametrize(("kwargs", "bad", "good", "fails"), [
    ({"max_records": 3}, 3, 0, False),
    ({"max_records": 3}, 4, 100, True),
    ({"max_fraction": 0.1}, 1, 9, False),
    ({"max_fraction": 0.1}, 2, 9, True),
], ids=["count-at-limit", "count-over", "fraction-at-limit", "fraction-over"])  # fmt: skip
def test_thresholds_per_batch(tmp_path: Path, kwargs: dict[str, float], bad: int, good: int, fails: bool) -> None:
    b = BadRecords("deadLetter", path=str(tmp_path), **kwargs)  # type: ignore[arg-type]
    b.add(_records(bad))
    if fails:
        with pytest.raises(BadRecordsError, match="batch 4 has .* more than maxBadRecords"):
            b.settle(4, good, origin="o")
        assert not tmp_path.joinpath("batch=4").exists()
    else:
        assert b.settle(4, good, origin="o")["numBadRecordsDeadLettered"] == bad


def test_options_and_their_rules() -> None:
    schema = OptionSchema([Option("path", String())]).extended(BAD_RECORD_OPTIONS.options, rules=BAD_RECORD_OPTIONS.rules)
    assert BadRecords.from_options(schema.parse({}, connector="t", role="source")) is None
    opts = schema.parse({"badRecordsPolicy": "deadLetter", "badRecordsPath": "/tmp/dlq", "maxBadRecords": 5})
    b = BadRecords.from_options(opts)
    assert b is not None and b.policy == "deadLetter" and b.max_records == 5
    with pytest.raises(OptionsError, match="is required with badRecordsPolicy=deadLetter"):
        schema.parse({"badRecordsPolicy": "deadLetter"})
    with pytest.raises(OptionsError, match="have no effect"):
        schema.parse({"maxBadRecords": 3})


def test_a_collector_refuses_to_travel_to_another_process() -> None:
    with pytest.raises(HeadraceError, match="cannot be read on a pickled copy"):
        pickle.dumps(BadRecords("drop", what="cloudFiles /in"))


class RejectingSink(Sink):
    """Writes rows to memory, rejecting negative values through the shared policy."""

    written: dict[str, list[int]] = {}

    def __init__(self, options: object, context: SinkContext) -> None:
        super().__init__(options, context)  # type: ignore[arg-type]
        self.bad_records = BadRecords.from_options(options, what="rejecting sink")  # type: ignore[arg-type]
        self._pending: list[int] = []

    def write(self, batch_id: int, data: Iterator[pa.RecordBatch]) -> CommitMessage | None:
        self._pending = []
        for b in data:
            values = b.column("value").to_pylist()
            bad = [BadRecord(f"batch {batch_id} row {i}", "negative value violates CHECK (value >= 0)", str(v))
                   for i, v in enumerate(values) if v < 0]  # fmt: skip
            if self.bad_records is not None:
                self.bad_records.add(bad)
            self._pending += [v for v in values if v >= 0 or self.bad_records is None]
        return None

    def commit(self, batch_id: int, messages: Sequence[CommitMessage | None]) -> None:
        self.written.setdefault(self.context.query_name, []).extend(self._pending)


_mod = ModuleType("rejecting_plugin")
_mod.headrace_connectors = hookimpl(lambda: [ConnectorSpec(  # type: ignore[attr-defined]
    name="rejecting", sink=f"{__name__}:RejectingSink",
    sink_options=OptionSchema([Option("unused", Integer())]).extended(BAD_RECORD_OPTIONS.options, rules=BAD_RECORD_OPTIONS.rules))])  # fmt: skip
registry().register_module(_mod, "tests")


def _signed(t: pa.Table) -> pa.Table:
    v = t.column("value")
    return t.set_column(1, "value", pc.if_else(pc.equal(pc.bit_wise_and(v, 3), 0), pc.negate(v), v))


def test_the_engine_settles_a_sinks_rejects_before_its_commit(tmp_path: Path) -> None:
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=8, totalRows=24).load().map_batches(_signed)
         .write_stream.format("rejecting").query_name("rej").options(badRecordsPolicy="deadLetter",
         badRecordsPath=str(tmp_path / "dlq")).option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(30)
    assert sorted(RejectingSink.written["rej"]) == [v for v in range(24) if v % 4 != 0 or v == 0]
    letters = read_dead_letters(str(tmp_path / "dlq"))
    assert sorted(-int(x["record"]) for x in letters) == [v for v in range(4, 24, 4)]
    assert {x["origin"] for x in letters} == {"sink-rejecting"}
    assert [p["sink"]["metrics"]["numBadRecordsDeadLettered"] for p in q.recent_progress] == [1, 2, 2]


def test_a_sink_over_its_threshold_fails_the_batch_uncommitted(tmp_path: Path) -> None:
    q = (hr.read_stream.format("rate-micro-batch").options(rowsPerBatch=8, totalRows=24).load().map_batches(_signed)
         .write_stream.format("rejecting").query_name("rej_max").options(badRecordsPolicy="drop", maxBadRecords=1)
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start())  # fmt: skip
    with pytest.raises(StreamingQueryException, match="batch 1 has 2 bad records, more than maxBadRecords=1"):
        q.await_termination(30)
    assert sorted(RejectingSink.written["rej_max"]) == [0, 1, 2, 3, 5, 6, 7]  # batch 0 only (its -4 dropped)

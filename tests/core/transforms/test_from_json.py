"""FromJson: JSON text to typed columns, bad records under the shared policy, SIGKILL-safe."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import headrace as hr
from headrace.badrecords import read_dead_letters
from headrace.connectors.files import read_files
from headrace.errors import HeadraceError, OptionsError, StreamingQueryException
from headrace.testing import memory_stream, run_until_done
from headrace.transforms.from_json import FromJson

SCHEMA = "id BIGINT, amount DOUBLE, at TIMESTAMP"


def test_good_records_take_the_fast_path_and_keep_other_columns() -> None:
    t = pa.table({"k": ["a", "b"], "value": ['{"id": 1, "amount": 2.5, "at": "2024-01-01T00:00:00"}', '{"id": 2, "x": 1}']})
    out = FromJson("value", SCHEMA)(t)
    assert out.column_names == ["k", "id", "amount", "at"]
    assert out.column("id").to_pylist() == [1, 2] and out.column("amount").to_pylist() == [2.5, None]
    assert str(out.schema.field("at").type).startswith("timestamp")
    assert FromJson("value", SCHEMA, keep=True)(t).column_names == ["k", "value", "id", "amount", "at"]


def test_binary_kafka_values_and_their_offsets_as_locations() -> None:
    t = pa.table({"value": [b'{"id": 1}', b"nope", b'{"id": "x"}', b"[1]"], "topic": ["ev"] * 4,
                  "partition": [0, 0, 1, 1], "offset": [10, 11, 20, 21]})  # fmt: skip
    fj = FromJson("value", "id BIGINT", badRecordsPolicy="drop")
    out = fj(t)
    assert out.column("id").to_pylist() == [1] and out.column("offset").to_pylist() == [10]
    assert fj.bad_records.pending() == 3
    with pytest.raises(HeadraceError, match=r"ev/0@11: malformed JSON"):
        FromJson("value", "id BIGINT")(t)


@pytest.mark.parametrize(("columns", "location"), [
    ({"data": [b"x"], "stream": ["s"], "shardId": ["shardId-000"], "sequenceNumber": ["4960"]}, "s/shardId-000@4960"),
    ({"payload": [b"x"], "messageId": ["m-1"]}, "messageId m-1"),
], ids=["kinesis", "pubsub"])  # fmt: skip
def test_locations_of_kinesis_and_pubsub_records(columns: dict[str, list[object]], location: str) -> None:
    column = "data" if "data" in columns else "payload"
    with pytest.raises(HeadraceError, match=f"bad record at {location}: malformed JSON"):
        FromJson(column, "id BIGINT")(pa.table(columns))


@pytest.mark.parametrize(("values", "bad"), [
    ([b'{"id": 1} {"id": 9}', b"  ", b'{"id": 3}'], ["row 0", "row 1"]),
    ([b'{"id": 1}\n{"id": 9}', b'{"id": 3}'], ["row 0"]),
    ([b' {"id": 1}', b"\t", b'{"id": 3}'], ["row 1"]),
], ids=["two-objects-and-a-blank", "a-newline-inside", "leading-space-and-a-blank"])  # fmt: skip
def test_records_that_would_shift_rows_in_one_parse_are_bad_records(values: list[bytes], bad: list[str]) -> None:
    """A record holding two objects and a blank one parse to as many rows as records in one
    newline-joined read: each record is still judged on its own."""
    fj = FromJson("value", "id BIGINT", badRecordsPolicy="drop")
    out = fj(pa.table({"value": pa.array(values, pa.binary())}))
    assert out.column("id").to_pylist() == [1, 3][-(len(values) - len(bad)) :]
    assert fj.bad_records.pending() == len(bad)
    with pytest.raises(HeadraceError, match=bad[0]):
        FromJson("value", "id BIGINT")(pa.table({"value": pa.array(values, pa.binary())}))


def test_bad_options_and_a_missing_column_are_clear() -> None:
    with pytest.raises(OptionsError, match="badRecordsPath"):
        FromJson("value", "id BIGINT", badRecordsPolicy="deadLetter")
    with pytest.raises(HeadraceError, match="no column 'body'"):
        FromJson("body", "id BIGINT")(pa.table({"value": ["{}"]}))


def test_in_a_query_bad_records_are_counted_with_the_batch(tmp_path: Path) -> None:
    stream = memory_stream("fj_in")
    stream.add([{"value": '{"id": 1, "amount": 1}'}, {"value": "oops"}, {"value": '{"id": 3, "amount": "x"}'}])
    q = (hr.read_stream.format("memory").option("name", "fj_in").load()
         .map_batches(FromJson("value", "id BIGINT, amount DOUBLE", badRecordsPolicy="deadLetter",
                               badRecordsPath=str(tmp_path / "dlq")))
         .write_stream.format("memory").query_name("fj_out").trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(30)
    assert hr.memory_table("fj_out").column("id").to_pylist() == [1]
    letters = read_dead_letters(str(tmp_path / "dlq"))
    assert [x["origin"] for x in letters] == ["transform-0"] * 2
    assert q.last_progress is not None
    assert q.last_progress["sink"]["metrics"]["transformBadRecordsDeadLettered"] == 2


def test_over_the_threshold_the_query_fails() -> None:
    stream = memory_stream("fj_max")
    stream.add([{"value": "bad"}] * 3 + [{"value": '{"id": 1}'}])
    q = (hr.read_stream.format("memory").option("name", "fj_max").load()
         .map_batches(FromJson("value", "id BIGINT", badRecordsPolicy="drop", maxBadRecordsFraction=0.5))
         .write_stream.format("memory").query_name("fj_max_out").trigger(available_now=True).start())  # fmt: skip
    with pytest.raises(StreamingQueryException, match="3 bad records out of 4"):
        q.await_termination(30)


@pytest.mark.slow
def test_sigkill_at_every_stage_dead_letters_every_bad_record_exactly_once(tmp_path: Path) -> None:
    total = 2000
    spec = {
        "source": {"format": "rate-micro-batch", "options": {"rowsPerBatch": 250, "totalRows": total, "numPartitions": 2}},
        "transform": "tests.core.transforms.from_json_pipeline:transform",
        "sink": {"format": "files", "options": {"path": str(tmp_path / "out"), "format": "arrow"}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"available_now": True},
    }  # fmt: skip
    results = run_until_done(spec, crashes=["mid_write:0", "before_sink_commit:1", "after_sink_commit:2", "after_commit:3"],
                             random_kills=1, kill_window=(0.8, 1.5), timeout=90,
                             env={"FROM_JSON_DLQ": str(tmp_path / "dlq")})  # fmt: skip
    assert sum(r.killed for r in results) >= 4
    bad = {v for v in range(total) if v % 5 == 2 or v % 7 == 4}
    got = read_files(str(tmp_path / "out"), "arrow").column("id").to_pylist()
    assert sorted(got) == sorted(set(range(total)) - bad)
    letters = read_dead_letters(str(tmp_path / "dlq"))
    texts = [x["record"] for x in letters]
    assert len(texts) == len(bad) and len(letters) == len(bad)
    ids = sorted(int(t.split()[-1].rstrip("}")) if t.startswith("{broken") else json.loads(t)["id"] for t in texts)
    assert ids == sorted(bad), "every bad record dead-lettered exactly once"

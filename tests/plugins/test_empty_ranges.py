"""Plugin sources whose range can hold no rows hand the sink an empty batch with their schema
(the engine's empty batch): foreach_batch never gets a table without columns."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

import headrace as hr


def collect(frame: hr.StreamFrame, chk: Path) -> list[pa.Table]:
    got: list[pa.Table] = []
    q = (frame.write_stream.foreach_batch(lambda t, _b: got.append(t)).option("checkpointLocation", str(chk))
         .trigger(available_now=True).start())  # fmt: skip
    q.await_termination(60)
    assert q.exception() is None
    return got


def test_cloudfiles_batch_of_empty_files(tmp_path: Path) -> None:
    land = tmp_path / "land"
    land.mkdir()
    (land / "a.json").write_text("")
    (land / "b.json").write_text("")
    frame = (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json").schema("id BIGINT, name STRING")
             .load(str(land)))  # fmt: skip
    got = collect(frame, tmp_path / "chk")
    assert [t.num_rows for t in got] == [0]
    assert got[0].column_names[:2] == ["id", "name"]


def test_delta_commit_without_rows(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    table = str(tmp_path / "t")
    schema = pa.schema([("v", pa.int64()), ("s", pa.string())])
    write_deltalake(table, pa.table({"v": [1], "s": ["a"]}, schema=schema))
    chk = tmp_path / "chk"
    frame = hr.read_stream.format("delta").load(table)
    assert [t.num_rows for t in collect(frame, chk)] == [1]
    write_deltalake(table, schema.empty_table(), mode="append")  # a commit that adds no row
    got = collect(hr.read_stream.format("delta").load(table), chk)
    assert got, "the empty commit makes a batch"
    assert all(t.num_rows == 0 and t.column_names[:2] == ["v", "s"] for t in got), [t.schema for t in got]


def test_kafka_range_holding_only_a_transaction_marker(kafka: object, tmp_path: Path) -> None:
    """A committed transaction's marker takes an offset: with maxOffsetsPerTrigger=1 the second
    batch covers only that marker, holds no row, and still reaches the sink with the columns."""
    import logging
    import uuid

    from confluent_kafka import Producer

    servers = kafka.bootstrap_servers  # type: ignore[attr-defined]
    topic = kafka.create_topic(f"tx-{uuid.uuid4().hex[:8]}", 1)  # type: ignore[attr-defined]
    p = Producer({"bootstrap.servers": servers, "transactional.id": f"tx-{uuid.uuid4().hex[:8]}",
                  "logger": logging.getLogger("tests.kafka.producer")})  # it outlives the session's brokers
    p.init_transactions(10)
    p.begin_transaction()
    p.produce(topic, b"a", partition=0)
    p.commit_transaction(10)
    frame = (hr.read_stream.format("kafka").option("kafka.bootstrap.servers", servers).option("subscribe", topic)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 1).load())  # fmt: skip
    got = collect(frame, tmp_path / "chk")
    assert [t.num_rows for t in got] == [1, 0]
    assert got[1].schema == got[0].schema and "value" in got[1].column_names

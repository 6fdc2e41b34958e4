"""Dead letters to a Kafka topic: ``badRecordsSink=kafka`` (headrace.badrecords), one message per
bad record, key = where it was, value = the dead letter as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa

import headrace as hr
from tests.plugins.kafka.helpers import consume_all, unique
from tests.services import KafkaMock


def test_bad_records_of_a_file_source_go_to_a_kafka_topic(kafka: KafkaMock, tmp_path: Path) -> None:
    topic = unique("dlq")
    kafka.create_topic(topic, 1)
    (tmp_path / "in").mkdir()
    lines = ['{"id": 1}', "not json", '{"id": "x"}', '{"id": 4}']
    tmp = tmp_path / "in" / ".a.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, tmp_path / "in" / "a.json")
    q = (hr.read_stream.format("cloudFiles").options({
            "cloudFiles.format": "json", "badRecordsPolicy": "deadLetter", "badRecordsSink": "kafka",
            "badRecordsSinkOptions": {"kafka.bootstrap.servers": kafka.bootstrap_servers, "topic": topic}})
         .schema("id BIGINT").load(str(tmp_path / "in"))
         .write_stream.format("memory").query_name(unique("q")).option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60)
    assert hr.memory_table(q.name).column("id").to_pylist() == [1, 4]
    messages = consume_all(kafka.bootstrap_servers, topic, expect=2)
    letters = sorted((json.loads(m.value()) for m in messages), key=lambda d: d["location"])
    assert [d["location"].rsplit("#", 1)[1] for d in letters] == ["record=1", "record=2"]
    assert [m.key().decode() for m in sorted(messages, key=lambda m: m.key())] == [d["location"] for d in letters]
    assert letters[0]["error"] == "malformed json record" and letters[0]["record"] == "not json"
    assert "is not int64" in letters[1]["error"] and letters[1]["batchId"] == 0
    assert letters[1]["origin"] == "source-0-cloudFiles"


def test_a_schema_applied_to_kafka_values_dead_letters_with_topic_partition_offset(kafka: KafkaMock, tmp_path: Path) -> None:
    from headrace.badrecords import read_dead_letters
    from headrace.transforms.from_json import FromJson
    from tests.plugins.kafka.helpers import produce

    topic = unique("events")
    kafka.create_topic(topic, 1)
    produce(kafka.bootstrap_servers, topic, ['{"id": 1}', "garbage", '{"id": 3}', '{"id": "three"}'], partition=0)
    q = (hr.read_stream.format("kafka").options({"kafka.bootstrap.servers": kafka.bootstrap_servers,
                                                 "subscribe": topic, "startingOffsets": "earliest"}).load()
         .map_batches(FromJson("value", "id BIGINT", badRecordsPolicy="deadLetter", badRecordsPath=str(tmp_path / "dlq")))
         .write_stream.format("memory").query_name(unique("q")).option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60)
    assert hr.memory_table(q.name).column("id").to_pylist() == [1, 3]
    letters = read_dead_letters(str(tmp_path / "dlq"))
    assert [x["location"] for x in letters] == [f"{topic}/0@1", f"{topic}/0@3"]
    assert letters[0]["record"] == "garbage" and "is not int64" in letters[1]["error"]


def test_a_query_reading_only_parsed_fields_builds_the_value_and_its_location(kafka: KafkaMock, tmp_path: Path) -> None:
    """``from_json`` of the value then a ``select`` of parsed fields: the source builds only
    ``value`` and the columns that locate a bad record (``Source.prune_columns``); the rows
    and the dead letters' locations are those of a full read."""
    from headrace.badrecords import read_dead_letters
    from headrace.transforms.from_json import FromJson
    from tests.plugins.kafka.helpers import produce

    class Recording(FromJson):
        seen: list[list[str]] = []

        def __call__(self, table: pa.Table) -> pa.Table:
            self.seen.append(table.column_names)
            return super().__call__(table)

    topic = unique("events")
    kafka.create_topic(topic, 2)
    produce(kafka.bootstrap_servers, topic, ['{"id": 1, "s": "a"}', "garbage", '{"id": 3, "s": "c"}'], partition=0)
    produce(kafka.bootstrap_servers, topic, ['{"id": 4, "s": "d"}', '{"id": "four"}'], partition=1)
    parse = Recording("value", "id BIGINT, s STRING", badRecordsPolicy="deadLetter", badRecordsPath=str(tmp_path / "dlq"))
    q = (hr.read_stream.format("kafka").options({"kafka.bootstrap.servers": kafka.bootstrap_servers,
                                                 "subscribe": topic, "startingOffsets": "earliest"}).load()
         .map_batches(parse).select("id")
         .write_stream.format("memory").query_name(unique("q")).option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60)
    assert sorted(hr.memory_table(q.name).column("id").to_pylist()) == [1, 3, 4]
    assert parse.seen and all(cols == ["value", "topic", "partition", "offset"] for cols in parse.seen), parse.seen
    letters = read_dead_letters(str(tmp_path / "dlq"))
    assert sorted(x["location"] for x in letters) == [f"{topic}/0@1", f"{topic}/1@1"]


def test_a_query_reading_every_column_builds_them_all(kafka: KafkaMock, tmp_path: Path) -> None:
    """Without a step that narrows the columns (``from_json`` keeps the other columns), the
    source builds every column: nothing is pruned that a later step may read."""
    from headrace.transforms.from_json import FromJson
    from tests.plugins.kafka.helpers import produce

    topic = unique("events")
    kafka.create_topic(topic, 1)
    produce(kafka.bootstrap_servers, topic, ['{"id": 1}', '{"id": 2}'], partition=0)
    q = (hr.read_stream.format("kafka").options({"kafka.bootstrap.servers": kafka.bootstrap_servers,
                                                 "subscribe": topic, "startingOffsets": "earliest"}).load()
         .map_batches(FromJson("value", "id BIGINT"))
         .write_stream.format("memory").query_name(unique("q")).option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(60)
    out = hr.memory_table(q.name)
    assert out.column_names == ["key", "topic", "partition", "offset", "timestamp", "timestampType", "id"]
    assert out.column("id").to_pylist() == [1, 2] and out.column("offset").to_pylist() == [0, 1]

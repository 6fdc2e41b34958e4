"""docs/spark.md "Porting from Databricks": each Databricks snippet on that page, run exactly as
the page shows it, after the one documented edit (the session object: ``spark = hr``; in a
pipeline file ``from pyspark import pipelines as dp`` becomes headrace's), against real files,
Delta tables in a local warehouse, and Kafka / Pub/Sub test servers. The snippet's literal
paths and ``<placeholders>`` are pointed at the test's folder and servers; nothing else of its
text changes."""

from __future__ import annotations

import json
import os
import re
import textwrap
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import headrace as hr
from headrace.api.warehouse import set_warehouse, table_path
from headrace.errors import OptionsError
from headrace.testing import wait_for

pytest.importorskip("deltalake")

DOC = Path(__file__).resolve().parents[3] / "docs" / "spark.md"
NOTEBOOK_SESSION = "import headrace as hr\nspark = hr\n"
PIPELINE_SESSION = "import headrace as hr\nimport headrace.pipelines as dp\nspark = hr\n"


def snippet(name: str) -> str:
    """The code block of docs/spark.md marked ``<!-- porting: name -->``."""
    text = DOC.read_text()
    m = re.search(rf"<!-- porting: {re.escape(name)} -->\n```python\n(.*?)```", text, re.S)
    assert m is not None, f"docs/spark.md has no snippet {name!r}"
    return m.group(1)


def as_pipeline_file(code: str, **names: Any) -> str:
    """The pipeline file headrace runs: the session edit, the snippet's free names bound."""
    code = code.replace("from pyspark import pipelines as dp\n", "")
    code = code.replace("from pyspark.sql.functions import", "from headrace.functions import")
    bound = "".join(f"{k} = {v!r}\n" for k, v in names.items())
    return PIPELINE_SESSION + bound + code


@pytest.fixture
def warehouse(tmp_path: Path) -> Any:
    previous = set_warehouse(tmp_path / "warehouse")
    yield tmp_path / "warehouse"
    set_warehouse(previous)


def _delta_rows(name: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    path = table_path(name)
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return []
    return DeltaTable(path).to_pyarrow_table().to_pylist()


def _write_json(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, folder / name)


# ------------------------------------------------------------------------------ seeds/000


def test_000_append_then_complete_to_tables(warehouse: Path, tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    _write_json(landing, "a.json", [{"customerId": 1, "amount": 5}, {"customerId": 2, "amount": 7}, {"customerId": 1, "amount": 1}])
    events = (hr.readStream.format("cloudFiles").option("cloudFiles.format", "json")
              .schema("customerId BIGINT, amount BIGINT").load(str(landing)))  # fmt: skip
    paths = {"/tmp/delta/": f"{tmp_path}/delta/"}
    queries = []
    try:
        for name in ("000-append", "000-complete"):
            code = snippet(name)
            for old, new in paths.items():
                code = code.replace(old, new)
            cell: dict[str, Any] = {"events": events}
            exec(NOTEBOOK_SESSION, cell)
            queries.append(eval(code, cell))  # the snippet is one expression: its value is the query
            if name == "000-append":
                wait_for(lambda: len(_delta_rows("events")) == 3, timeout=60, what="the events table", interval=0.3)
        counts = lambda: sorted((r["customerId"], r["count"]) for r in _delta_rows("events_by_customer"))  # noqa: E731
        wait_for(lambda: counts() == [(1, 2), (2, 1)], timeout=60, what="events_by_customer", interval=0.3)
        _write_json(landing, "b.json", [{"customerId": 2, "amount": 3}, {"customerId": 3, "amount": 4}])
        wait_for(lambda: counts() == [(1, 2), (2, 2), (3, 1)], timeout=60, what="new events counted", interval=0.3)
    finally:
        for q in queries:
            q.stop()
    for q in queries:
        assert q.exception() is None, q.exception()
    assert os.path.isdir(f"{tmp_path}/delta/events/_checkpoints/")


def _run_frame(frame: Any, checkpoint: Path) -> list[dict[str, Any]]:
    got: list[pa.Table] = []
    lock = threading.Lock()

    def collect(table: pa.Table, batch_id: int) -> None:
        with lock:
            got.append(table)

    q = (frame.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())  # fmt: skip
    assert q.awaitTermination(60)
    assert q.exception() is None, q.exception()
    return [r for t in got for r in t.to_pylist()]


def _notebook_expression(name: str) -> Any:
    """The snippet as a Python cell evaluates it (the Scala-shaped text in parentheses)."""
    cell: dict[str, Any] = {}
    exec(NOTEBOOK_SESSION, cell)
    return eval(f"({snippet(name)})", cell)


def test_000_skip_change_commits(warehouse: Path, tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    path = table_path("source_table")
    write_deltalake(path, pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}))
    assert sorted(r["id"] for r in _run_frame(_notebook_expression("000-skipChangeCommits"), tmp_path / "c")) == [1, 2, 3]
    DeltaTable(path).update(updates={"v": "'B'"}, predicate="id = 2")  # a change commit: skipped
    DeltaTable(path).delete("id = 3")  # skipped too
    write_deltalake(path, pa.table({"id": [4], "v": ["d"]}), mode="append")
    assert [r["id"] for r in _run_frame(_notebook_expression("000-skipChangeCommits"), tmp_path / "c")] == [4]


def test_000_ignore_deletes(warehouse: Path, tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    path = table_path("user_events")
    write_deltalake(path, pa.table({"date": ["2024-01-01", "2024-01-02"], "user_email": ["a@x", "b@x"],
                                    "action": ["in", "out"]}), partition_by=["date"])  # fmt: skip
    assert len(_run_frame(_notebook_expression("000-ignoreDeletes"), tmp_path / "c")) == 2
    DeltaTable(path).delete("date = '2024-01-01'")  # a whole partition: ignored
    write_deltalake(path, pa.table({"date": ["2024-01-03"], "user_email": ["c@x"], "action": ["in"]}), mode="append")
    assert [r["user_email"] for r in _run_frame(_notebook_expression("000-ignoreDeletes"), tmp_path / "c")] == ["c@x"]


@pytest.mark.parametrize(("name", "want"), [("000-startingVersion", [5, 6]), ("000-startingTimestamp", list(range(7)))],
                         ids=["startingVersion", "startingTimestamp"])  # fmt: skip
def test_000_starting_point(warehouse: Path, tmp_path: Path, name: str, want: list[int]) -> None:
    from deltalake import write_deltalake

    for i in range(7):  # versions 0..6, one row each
        write_deltalake(table_path("user_events"), pa.table({"id": [i]}), mode="append")
    assert sorted(r["id"] for r in _run_frame(_notebook_expression(name), tmp_path / "c")) == want


def test_000_with_event_time_order_needs_the_event_time_column(warehouse: Path) -> None:
    """Not runnable as written (docs): headrace's delta source takes the column from an option."""
    from deltalake import write_deltalake

    write_deltalake(table_path("user_events"), pa.table({"event_time": pa.array([0], pa.timestamp("us", tz="UTC"))}))
    spark = hr
    with pytest.raises(OptionsError, match="eventTimeColumn"):
        spark.readStream.option("withEventTimeOrder", "true").table("user_events").withWatermark("event_time", "10 seconds")


# ------------------------------------------------------------------------------ pipelines


def _project(tmp_path: Path, code: str) -> Path:
    root = tmp_path / "project"
    (root / "transformations").mkdir(parents=True)
    (root / "pipeline.yml").write_text(textwrap.dedent("""\
        name: porting
        storage: storage
        configuration:
          pipelines.continuous.checkInterval: "0.2 seconds"
        libraries:
          - glob:
              include: transformations/**
        """))
    (root / "transformations" / "defs.py").write_text(code)
    return root


def _run(root: Path, *, continuous: bool = False, until: Any = None) -> Any:
    from headrace.pipelines.runner import PipelineRun
    from headrace.pipelines.spec import load_pipeline

    run = PipelineRun(load_pipeline(str(root / "pipeline.yml")), out=lambda line: None, continuous=continuous)
    if not continuous:
        return run.run()
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(run.run()), daemon=True)
    t.start()
    try:
        until(run)
    finally:
        run.stop()
        t.join(120)
    assert not t.is_alive()
    return box[0]


def _pipeline_table(root: Path, name: str) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return DeltaTable(str(root / "storage" / "tables" / name)).to_pyarrow_table().to_pylist()


def test_004_cloudfiles_streaming_table(tmp_path: Path) -> None:
    files = tmp_path / "files"
    _write_json(files, "c1.json", [{"id": 1, "name": "Bilal"}, {"id": 2, "name": "Olga"}])
    code = as_pipeline_file(snippet("004-cloudfiles").replace("/Volumes/path/to/files", str(files)))
    root = _project(tmp_path, code)
    result = _run(root)
    assert result.state == "COMPLETED", result
    assert sorted((r["id"], r["name"]) for r in _pipeline_table(root, "customers_bronze")) == [(1, "Bilal"), (2, "Olga")]


def test_004_stream_snapshot_join(warehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltalake import write_deltalake

    write_deltalake(table_path("transactions"), pa.table({"customer_id": [1, 2, 3], "value": [100, 150, 299]}))
    write_deltalake(table_path("customers"), pa.table({"customer_id": [1, 2], "name": ["Bilal", "Olga"]}))
    root = _project(tmp_path, as_pipeline_file(snippet("004-snapshot-join")))
    result = _run(root)
    assert result.state == "COMPLETED", result
    rows = sorted((r["customer_id"], r["value"], r["name"]) for r in _pipeline_table(root, "sales_report"))
    assert rows == [(1, 100, "Bilal"), (2, 150, "Olga")]  # customer 3 has no row in the snapshot


def test_004_pubsub_streaming_table(tmp_path: Path, pubsub_emulator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator.host)
    publisher = pubsub_emulator.publisher()
    subscriber = pubsub_emulator.subscriber()
    topic = publisher.topic_path("my-project", "my-topic")
    sub = subscriber.subscription_path("my-project", "my-subscription")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=sub, topic=topic)
    for i in range(3):
        publisher.publish(topic, f"m{i}".encode()).result(30)
    code = as_pipeline_file(snippet("004-pubsub"), client_id="1", client_email="sa@my-project.iam.gserviceaccount.com",
                            private_key="unused by the emulator", private_key_id="k1")  # fmt: skip
    root = _project(tmp_path, code)

    def three_rows(run: Any) -> None:
        wait_for(lambda: _safe_rows(root, "pubsub_raw") >= 3, timeout=90, what="3 messages in pubsub_raw", interval=0.5)

    _run(root, continuous=True, until=three_rows)
    values = sorted(bytes(r["payload"]).decode() for r in _pipeline_table(root, "pubsub_raw"))
    assert values == ["m0", "m1", "m2"]


def _safe_rows(root: Path, name: str) -> int:
    try:
        return len(_pipeline_table(root, name))
    except Exception:  # not created yet
        return 0


def _kafka_values(servers: str, topic: str, expect: int) -> list[str]:
    from tests.plugins.kafka.helpers import consume_all

    return sorted(m.value().decode() for m in consume_all(servers, topic, expect=expect, timeout=5))


def _kafka_project(tmp_path: Path, kafka: Any, name: str) -> tuple[Path, str, str, str]:
    from deltalake import write_deltalake

    from tests.plugins.kafka.helpers import unique

    servers = kafka.bootstrap_servers
    input_topic, output_topic = kafka.create_topic(unique("in")), kafka.create_topic(unique("out"))
    write_deltalake(table_path("catalog.schema.lookup_table"), pa.table({"lookup_key": ["a", "b"], "lookup_value": ["A", "B"]}))
    code = as_pipeline_file(snippet(name), broker_address=servers, input_topic=input_topic, output_topic=output_topic,
                            enriched_output_topic=output_topic)  # fmt: skip
    return _project(tmp_path, code), servers, input_topic, output_topic


def test_001_real_time_kafka_to_kafka(warehouse: Path, tmp_path: Path, kafka: Any) -> None:
    from tests.plugins.kafka.helpers import produce

    root, servers, input_topic, output_topic = _kafka_project(tmp_path, kafka, "001-kafka-to-kafka")

    def flowing(run: Any) -> None:
        q = wait_for(lambda: run._queries.get("kafka_rtm_flow"), timeout=60, what="the real-time flow to start")
        assert q.trigger.kind == "real_time"

        def produced_and_arrived() -> bool:
            # startingOffsets latest: the flow sees what is produced once its consumer is placed,
            # so produce until rows come out
            produce(servers, input_topic, ["a", "b", "c"])
            return set(_kafka_values(servers, output_topic, 3)) == {"a", "b", "c"}

        wait_for(produced_and_arrived, timeout=120, what="rows on the output topic", interval=1.0)

    _run(root, continuous=True, until=flowing)
    assert set(_kafka_values(servers, output_topic, 3)) == {"a", "b", "c"}


def test_001_broadcast_join_into_kafka_has_no_value_column(warehouse: Path, tmp_path: Path, kafka: Any) -> None:
    """As written the snippet selects event_key, lookup_value and timestamp into a Kafka sink,
    which needs a ``value`` column, on Spark ("Required attribute 'value' not found") as on
    headrace: the join runs (the lookup is the warehouse's table) and the sink refuses the rows."""
    from tests.plugins.kafka.helpers import produce

    root, servers, input_topic, _output = _kafka_project(tmp_path, kafka, "001-broadcast-join")

    def refused(run: Any) -> None:
        q = wait_for(lambda: run._queries.get("enriched_events_flow"), timeout=60, what="the real-time flow to start")
        assert q.trigger.kind == "real_time"

        def produced_and_failed() -> bool:
            produce(servers, input_topic, ["a", "b", "c"])
            return q.exception() is not None

        wait_for(produced_and_failed, timeout=120, what="the sink to refuse the rows", interval=1.0)
        assert "no 'value' column (columns: event_key, lookup_value, timestamp)" in str(q.exception())

    _run(root, continuous=True, until=refused)


def test_every_marked_snippet_is_run_here() -> None:
    marked = set(re.findall(r"<!-- porting: (\S+) -->", DOC.read_text()))
    source = Path(__file__).read_text()
    assert marked and all(f'"{m}"' in source for m in marked), sorted(m for m in marked if f'"{m}"' not in source)

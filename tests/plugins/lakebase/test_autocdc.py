"""AUTO CDC into PostgreSQL (the lakebase sink with sequenceBy / applyAsDeletes): latest event
per key, deletes, ignored pre-images, out-of-order events, column lists, idempotent replays."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from headrace.plugins import registry
from headrace.protocols import SinkContext

Query = Callable[..., list[tuple[Any, ...]]]

CDC = {"keys": "id", "sequenceBy": "seq", "applyAsDeletes": "_change_type = 'delete'", "exceptColumnList": "_change_type"}


def sink(options: dict[str, Any], query_id: str = "q1") -> Any:
    spec = registry().get("lakebase")
    opts = spec.sink_options.parse(options, connector="lakebase", role="sink")
    return spec.load_sink()(opts, SinkContext(query_id=query_id))


def events(rows: list[tuple[int, str | None, int, str]]) -> pa.Table:
    ids, vs, seqs, types = zip(*rows, strict=True)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array(vs, pa.string()), "seq": pa.array(seqs, pa.int64()),
                     "_change_type": pa.array(types, pa.string())})  # fmt: skip


def apply(s: Any, batch_id: int, table: pa.Table, size: int = 2) -> None:
    msg = s.write(batch_id, iter(table.to_batches(max_chunksize=size)))
    s.commit(batch_id, [msg])


def test_latest_event_per_key_wins_and_deletes_apply(pg_options: dict[str, Any], table: str, query: Query) -> None:
    s = sink({**pg_options, **CDC, "batchsize": 100})
    apply(s, 0, events([(1, "a", 1, "insert"), (2, "b", 2, "insert"), (3, "c", 3, "insert")]))
    # out of order within the batch: seq 9 is the latest for id 1 although it comes first
    apply(s, 1, events([(1, "new", 9, "update_postimage"), (1, "old", 5, "update_postimage"),
                        (1, "IGNORED", 10, "update_preimage"), (2, None, 6, "delete"), (4, "d", 7, "insert")]))  # fmt: skip
    assert query(f"SELECT id, v, seq FROM {table} ORDER BY id") == [(1, "new", 9), (3, "c", 3), (4, "d", 7)]
    # an older event in a later batch is ignored (the target keeps seq)
    apply(s, 2, events([(1, "stale", 4, "update_postimage"), (3, None, 2, "delete")]))
    assert query(f"SELECT id, v, seq FROM {table} ORDER BY id") == [(1, "new", 9), (3, "c", 3), (4, "d", 7)]
    cols = [r[0] for r in query("SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,))]
    assert "_change_type" not in cols
    s.close()


def test_replayed_batch_changes_nothing(pg_options: dict[str, Any], table: str, query: Query) -> None:
    s = sink({**pg_options, **CDC, "batchsize": 2})
    apply(s, 0, events([(i, f"v{i}", i, "insert") for i in range(10)]))
    batch = events([(1, None, 20, "delete"), (2, "x", 21, "update_postimage"), (11, "n", 22, "insert")])
    apply(s, 1, batch)
    query(f"UPDATE {table} SET v = 'changed later' WHERE id = 2")  # a replay must not overwrite this
    apply(sink({**pg_options, **CDC, "batchsize": 2}), 1, batch)  # a restart replays batch 1
    rows: dict[int, str | None] = dict(query(f"SELECT id, v FROM {table}"))
    assert 1 not in rows and rows[2] == "changed later" and rows[11] == "n" and len(rows) == 10
    s.close()


def test_column_list_and_errors(pg_options: dict[str, Any], table: str, query: Query) -> None:
    s = sink({**pg_options, "keys": "id", "sequenceBy": "seq", "columnList": "id,v"})
    apply(s, 0, events([(1, "a", 1, "insert")]))
    assert query(f"SELECT * FROM {table}") == [(1, "a")]
    bad = sink({**pg_options, "dbtable": f"public.x_{uuid.uuid4().hex[:8]}", "keys": "nope", "sequenceBy": "seq"})
    with pytest.raises(Exception, match=r"key column\(s\) nope are not in the change stream"):
        apply(bad, 0, events([(1, "a", 1, "insert")]))
    spec = registry().get("lakebase")
    with pytest.raises(Exception, match=r"applies only to AUTO CDC"):
        spec.sink_options.parse({**pg_options, "columnList": "id"}, connector="lakebase", role="sink")

"""Delete tombstones of the lakebase sink's AUTO CDC mode: an older event arriving after a
delete (in a later batch) does not bring the row back; retention; replays; real PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from headrace.plugins import registry
from headrace_lakebase.sink import LakebaseCommitMessage
from headrace_lakebase.tombstones import tombstone_table_name
from tests.plugins.lakebase.test_autocdc import CDC, apply, events, sink

Query = Callable[..., list[tuple[Any, ...]]]
NO_SEQ = {**CDC, "exceptColumnList": "_change_type,seq"}  # the target does not keep the sequence


@pytest.mark.parametrize("cdc", [CDC, NO_SEQ], ids=["target-keeps-seq", "target-without-seq"])
def test_older_insert_after_a_delete_stays_deleted(pg_options: dict[str, Any], table: str, query: Query,
                                                   cdc: dict[str, str]) -> None:  # fmt: skip
    s = sink({**pg_options, **cdc, "batchsize": 2})
    apply(s, 0, events([(1, "a", 1, "insert"), (2, "b", 2, "insert"), (3, "c", 3, "insert")]))
    apply(s, 1, events([(1, None, 10, "delete"), (2, None, 11, "delete")]))
    # out of order: older events of the deleted keys arrive in a later batch
    apply(s, 2, events([(1, "late insert", 5, "insert"), (2, "late update", 9, "update_postimage"),
                        (2, None, 8, "delete"), (3, "c2", 12, "update_postimage")]))  # fmt: skip
    assert query(f"SELECT id, v FROM {table} ORDER BY id") == [(3, "c2")]
    tomb = tombstone_table_name(table)
    assert query(f'SELECT id, __headrace_seq FROM "{tomb}" ORDER BY id') == [(1, 10), (2, 11)]
    # a newer event re-creates the key; an event older than that delete, and a stale delete, do not count
    apply(s, 3, events([(1, "back", 20, "insert")]))
    apply(s, 4, events([(1, None, 7, "delete"), (2, "older", 10, "insert")]))
    assert query(f"SELECT id, v FROM {table} ORDER BY id") == [(1, "back"), (3, "c2")]
    s.close()


def test_replay_changes_nothing_and_retention_collects(pg_options: dict[str, Any], table: str, query: Query) -> None:
    s = sink({**pg_options, **NO_SEQ, "batchsize": 3})
    apply(s, 0, events([(i, f"v{i}", i, "insert") for i in range(6)]))
    batch = events([(1, None, 20, "delete"), (2, None, 21, "delete"), (7, "n", 22, "insert")])
    apply(s, 1, batch)
    tomb = tombstone_table_name(table)
    before = query(f'SELECT id, __headrace_seq, deleted_at FROM "{tomb}" ORDER BY id')
    apply(sink({**pg_options, **NO_SEQ, "batchsize": 3}), 1, batch)  # a restart replays batch 1
    assert query(f'SELECT id, __headrace_seq, deleted_at FROM "{tomb}" ORDER BY id') == before
    assert [r[0] for r in query(f"SELECT id FROM {table} ORDER BY id")] == [0, 3, 4, 5, 7]
    # tombstones past the retention are collected after a commit; a late event then comes back (as documented)
    query(f"UPDATE \"{tomb}\" SET deleted_at = now() - interval '3 hours' WHERE id = 1")
    s2 = sink({**pg_options, **NO_SEQ, "tombstoneRetention": "1 hour"})
    apply(s2, 2, events([(2, "late", 3, "insert"), (1, "late", 3, "insert")]))
    assert query(f'SELECT id FROM "{tomb}"') == [(2,)]
    assert query(f"SELECT id, v FROM {table} WHERE id IN (1, 2)") == []  # applied before the collection
    apply(s2, 3, events([(1, "late again", 4, "insert"), (2, "late again", 4, "insert")]))
    assert query(f"SELECT id, v FROM {table} WHERE id IN (1, 2)") == [(1, "late again")]
    # the driver's sink under Spark never wrote (the tasks did): its commit collects as well
    query(f"UPDATE \"{tomb}\" SET deleted_at = now() - interval '3 hours'")
    driver = sink({**pg_options, **NO_SEQ, "tombstoneRetention": "1 hour"}, query_id="q1")
    driver.commit(4, [LakebaseCommitMessage("p0:x", 1, 0, 1)])
    assert query(f'SELECT id FROM "{tomb}"') == []
    s.close()
    s2.close()
    driver.close()


def test_zero_retention_keeps_no_tombstones(pg_options: dict[str, Any], table: str, query: Query) -> None:
    s = sink({**pg_options, **NO_SEQ, "tombstoneRetention": "0"})
    apply(s, 0, events([(1, "a", 1, "insert")]))
    apply(s, 1, events([(1, None, 5, "delete")]))
    apply(s, 2, events([(1, "late", 3, "insert")]))
    assert query(f"SELECT id, v FROM {table}") == [(1, "late")]  # no tombstone: the old behaviour
    assert query("SELECT to_regclass(%s)", (f"public.{tombstone_table_name(table)}",)) == [(None,)]
    s.close()


def test_options() -> None:
    spec = registry().get("lakebase")
    opts = spec.sink_options.parse({"url": "postgresql://x@h/db", "dbtable": "t", **CDC}, connector="lakebase", role="sink")
    assert opts["tombstoneRetention"] == 2 * 86400.0
    with pytest.raises(Exception, match="tombstoneRetention"):
        spec.sink_options.parse({"url": "postgresql://x@h/db", "dbtable": "t", **CDC, "tombstoneRetention": "-1 s"},
                                connector="lakebase", role="sink")  # fmt: skip
    assert len(tombstone_table_name("x" * 63)) <= 63

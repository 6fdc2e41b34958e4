# ruff: noqa: F811  (pytest fixtures imported from cdc_helpers)
"""The PostgreSQL change source on a real server with wal_level=logical: offsets are LSNs,
reads peek, the slot advances only on commit, snapshot hand-over, types, TOAST, errors."""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace.plugins import registry
from headrace.protocols import ReadLimit, Source, SourceContext
from tests.plugins.lakebase.cdc_helpers import Sql, cdc_name, cdc_options, lsql  # noqa: F401
from tests.services import Postgres


def make_source(options: dict[str, Any], **more: Any) -> Source:
    spec = registry().get("postgresql")
    opts = spec.source_options.parse({**options, **more}, connector="lakebase", role="source")
    return spec.load_source()(opts, SourceContext(query_id="q", run_id=uuid.uuid4().hex))


def read(src: Source, start: dict[str, Any], end: dict[str, Any]) -> pa.Table:
    batches = [b for p in src.partitions(start, end) for b in src.read(p)]
    return pa.Table.from_batches(batches, schema=src.schema)


def drain(src: Source, start: dict[str, Any], limit: ReadLimit | None = None) -> tuple[list[pa.Table], dict[str, Any]]:
    out: list[pa.Table] = []
    while True:
        end = src.latest_offset(start, limit or src.default_read_limit())
        if end == start:
            return out, start
        out.append(read(src, start, end))
        src.commit(end)
        start = end


def slot_lsn(lsql: Sql, slot: str) -> str:
    return str(lsql("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,))[0][0])


def test_changes_peeked_replayed_and_slot_advanced_only_on_commit(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, v text) ")
    lsql(f"ALTER TABLE {cdc_name} REPLICA IDENTITY FULL")
    src = make_source(cdc_options, snapshotMode="never")
    try:
        start = src.initial_offset()
        assert start["phase"] == "stream" and json.loads(json.dumps(start)) == start
        lsql(f"INSERT INTO {cdc_name} VALUES (1, 'a'), (2, 'b')")
        lsql(f"UPDATE {cdc_name} SET v = 'B' WHERE id = 2")
        lsql(f"DELETE FROM {cdc_name} WHERE id = 1")
        # a rolled-back transaction never appears
        with pytest.raises(RuntimeError), __import__("psycopg").connect(cdc_options["url"]) as c:
            c.execute(f"INSERT INTO {cdc_name} VALUES (99, 'rolled back')")
            raise RuntimeError("roll back")
        end = src.latest_offset(start, ReadLimit.all_available())
        assert end["lsn"] > start["lsn"]
        before = slot_lsn(lsql, cdc_options["slotName"])
        t1 = read(src, start, end)
        t2 = read(src, start, end)  # a replay reads the same changes
        assert t1.drop_columns(["_commit_timestamp"]).to_pylist() == t2.drop_columns(["_commit_timestamp"]).to_pylist()
        assert slot_lsn(lsql, cdc_options["slotName"]) == before, "reading consumed the slot"
        rows = [(r["id"], r["v"], r["_change_type"]) for r in t1.to_pylist()]
        assert rows == [(1, "a", "insert"), (2, "b", "insert"), (2, "b", "update_preimage"),
                        (2, "B", "update_postimage"), (1, "a", "delete")]  # fmt: skip
        lsns = t1.column("_lsn").to_pylist()
        assert lsns == sorted(lsns)
        src.commit(end)
        assert slot_lsn(lsql, cdc_options["slotName"]) != before
        assert src.latest_offset(end, ReadLimit.all_available()) == end
        metrics = src.metrics(end)
        assert metrics["lagBytes"] >= 0 and metrics["lagSeconds"] == 0
    finally:
        src.close()


def test_max_changes_per_trigger_cuts_at_transaction_ends(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, n int)")
    src = make_source(cdc_options, snapshotMode="never", maxChangesPerTrigger=10)
    try:
        start = src.initial_offset()
        for i in range(6):  # 6 transactions of 4 rows
            lsql(f"INSERT INTO {cdc_name} SELECT g, 0 FROM generate_series({i * 4}, {i * 4 + 3}) g")
        first = src.latest_offset(start, src.default_read_limit())
        backlog = src.metrics(first)
        assert backlog["lagBytes"] > 0 and backlog["lagSeconds"] >= 0
        tables, _ = drain(src, start)
        assert [t.num_rows for t in tables] == [8, 8, 8]  # 10 messages: two transactions of 1 + 4 + 1
        ids = [r["id"] for t in tables for r in t.to_pylist()]
        assert ids == list(range(24))
    finally:
        src.close()


def test_snapshot_then_stream_hands_over_exactly(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql,
                                                 postgres_logical: Postgres) -> None:  # fmt: skip
    import psycopg

    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, n int)")
    lsql(f"INSERT INTO {cdc_name} SELECT g, 0 FROM generate_series(1, 250) g")
    # the slot first (creating it waits for running transactions), then a transaction in progress
    # while the snapshot is taken: not in the snapshot, so streamed
    lsql(f"CREATE PUBLICATION {cdc_options['publicationName']} FOR TABLE {cdc_name}")
    lsql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (cdc_options["slotName"],))
    pending = psycopg.connect(postgres_logical.dsn)
    pending.execute(f"UPDATE {cdc_name} SET n = 7 WHERE id = 3")
    src = make_source(cdc_options, snapshotChunkRows=100)
    try:
        start = src.initial_offset()
        assert start["phase"] == "snapshot"
        pending.commit()
        pending.close()
        lsql(f"UPDATE {cdc_name} SET n = 1 WHERE id = 5")
        lsql(f"INSERT INTO {cdc_name} VALUES (1000, 0)")
        tables, end = drain(src, start)
        snap_rows = [r for t in tables for r in t.to_pylist() if r["_lsn"] == 0]
        assert [t.num_rows for t in tables][:3] == [100, 100, 50]
        assert {r["id"]: r["n"] for r in snap_rows}[5] == 0  # the snapshot predates the update of 5
        changes = [(r["id"], r["n"], r["_change_type"]) for t in tables for r in t.to_pylist() if r["_lsn"]]
        assert changes == [(3, None, "update_preimage"), (3, 7, "update_postimage"), (5, None, "update_preimage"),
                           (5, 1, "update_postimage"), (1000, 0, "insert")]  # fmt: skip
        assert end["phase"] == "stream" and end["snap"] is None
    finally:
        src.close()


@pytest.mark.parametrize("when", ["before_planning", "before_reading"])
def test_a_lost_snapshot_connection_is_replaced_and_every_row_arrives(cdc_options: dict[str, Any], cdc_name: str,
                                                                      lsql: Sql, when: str) -> None:  # fmt: skip
    """The server ends the connection holding the snapshot (a restart, an administrator)
    between batches: the source takes a new snapshot, as a restarted query does."""
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, n int)")
    lsql(f"ALTER TABLE {cdc_name} REPLICA IDENTITY FULL")
    lsql(f"INSERT INTO {cdc_name} SELECT g, 0 FROM generate_series(1, 250) g")
    src = make_source(cdc_options, snapshotChunkRows=100)
    try:
        start = src.initial_offset()
        end = src.latest_offset(start, src.default_read_limit())
        first = read(src, start, end)
        src.commit(end)
        start = end
        if when == "before_reading":
            end = src.latest_offset(start, src.default_read_limit())
        pid = src._held.conn.info.backend_pid  # type: ignore[attr-defined]
        lsql("SELECT pg_terminate_backend(%s)", (pid,))
        if when == "before_reading":
            rest = [read(src, start, end)]
            src.commit(end)
            more, _ = drain(src, end)
            rest += more
        else:
            rest, _ = drain(src, start)
        ids = sorted(r["id"] for t in [first, *rest] for r in t.to_pylist())
        assert ids == list(range(1, 251))
    finally:
        src.close()


def test_initial_only_reads_the_rows_and_ends(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    lsql(f"CREATE TABLE {cdc_name} (a text, b int, PRIMARY KEY (a, b))")
    lsql(f"ALTER TABLE {cdc_name} REPLICA IDENTITY FULL")
    lsql(f"INSERT INTO {cdc_name} SELECT 'k' || (g % 7), g FROM generate_series(1, 60) g")
    src = make_source(cdc_options, snapshotMode="initial_only", snapshotChunkRows=25)
    try:
        tables, end = drain(src, src.initial_offset())
        assert end["phase"] == "done"
        got = sorted((r["a"], r["b"]) for t in tables for r in t.to_pylist())
        assert got == sorted((f"k{g % 7}", g) for g in range(1, 61))
        assert not lsql("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (cdc_options["slotName"],))
    finally:
        src.close()


TYPES = [
    ("b", "boolean", "true", True),
    ("i2", "smallint", "-3", -3),
    ("i4", "integer", "2147483647", 2147483647),
    ("i8", "bigint", "-9000000000", -9000000000),
    ("f4", "real", "1.5", 1.5),
    ("f8", "double precision", "0.1", 0.1),
    ("d", "numeric(12,3)", "1234.567", __import__("decimal").Decimal("1234.567")),
    ("t", "text", "'héllo'", "héllo"),
    ("vc", "varchar(10)", "'x'", "x"),
    ("by", "bytea", "'\\x00ff'::bytea", b"\x00\xff"),
    ("dt", "date", "'2024-02-29'", __import__("datetime").date(2024, 2, 29)),
    ("ts", "timestamp", "'2024-01-02 03:04:05.123456'", __import__("datetime").datetime(2024, 1, 2, 3, 4, 5, 123456)),
    ("tz", "timestamptz", "'2024-01-02 03:04:05+02'",
     __import__("datetime").datetime(2024, 1, 2, 1, 4, 5, tzinfo=__import__("datetime").timezone.utc)),
    ("tm", "time", "'12:30:01.5'", __import__("datetime").time(12, 30, 1, 500000)),
    ("iv", "interval", "'1 day 2 hours'", __import__("datetime").timedelta(days=1, hours=2)),
    ("js", "jsonb", "'{\"a\": [1, 2]}'", '{"a": [1, 2]}'),
    ("ai", "integer[]", "'{1,NULL,3}'", [1, None, 3]),
    ("at", "text[]", "'{a,\"b c\"}'", ["a", "b c"]),
    ("u", "uuid", "'00000000-0000-0000-0000-000000000001'", "00000000-0000-0000-0000-000000000001"),
]


@pytest.mark.parametrize("phase", ["snapshot", "stream"])
def test_every_sink_type_maps_back(phase: str, cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    cols = ", ".join(f"{n} {t}" for n, t, _, _ in TYPES)
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, {cols})")
    lsql(f"ALTER TABLE {cdc_name} REPLICA IDENTITY FULL")
    insert = f"INSERT INTO {cdc_name} VALUES (1, {', '.join(v for _, _, v, _ in TYPES)}), (2{', NULL' * len(TYPES)})"
    if phase == "snapshot":
        lsql(insert)
    src = make_source(cdc_options, snapshotMode="initial" if phase == "snapshot" else "never")
    try:
        start = src.initial_offset()
        if phase == "stream":
            lsql(insert)
        tables, _ = drain(src, start)
        rows = sorted((r for t in tables for r in t.to_pylist()), key=lambda r: r["id"])
        assert len(rows) == 2
        for name, _, _, expected in TYPES:
            assert rows[0][name] == expected, name
            assert rows[1][name] is None, name
    finally:
        src.close()


def test_unchanged_toasted_values_are_filled_not_null(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, big text, n int)")
    lsql(f"ALTER TABLE {cdc_name} REPLICA IDENTITY FULL")
    lsql(f"ALTER TABLE {cdc_name} ALTER COLUMN big SET STORAGE EXTERNAL")  # out of line, uncompressed
    big = "x" * 100_000
    src = make_source(cdc_options, snapshotMode="never")
    try:
        start = src.initial_offset()
        lsql(f"INSERT INTO {cdc_name} VALUES (1, %s, 0)", (big,))
        lsql(f"UPDATE {cdc_name} SET n = 1 WHERE id = 1")  # big unchanged: not sent by pgoutput
        tables, _ = drain(src, start)
        post = [r for t in tables for r in t.to_pylist() if r["_change_type"] == "update_postimage"]
        assert post and post[0]["big"] == big and post[0]["n"] == 1
    finally:
        src.close()


def test_toastable_table_without_full_identity_is_refused(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, big text)")
    with pytest.raises(Exception, match=r"REPLICA IDENTITY FULL"):
        make_source(cdc_options)


def test_truncate_is_reported(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY)")
    src = make_source(cdc_options, snapshotMode="never")
    try:
        start = src.initial_offset()
        lsql(f"INSERT INTO {cdc_name} VALUES (1)")
        lsql(f"TRUNCATE {cdc_name}")
        end = src.latest_offset(start, ReadLimit.all_available())
        with pytest.raises(Exception, match=r"was truncated .*onTruncate=ignore"):
            read(src, start, end)
    finally:
        src.close()


def test_dropped_slot_and_added_column_fail_clearly(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, n int)")
    src = make_source(cdc_options, snapshotMode="never")
    try:
        start = src.initial_offset()
        lsql(f"ALTER TABLE {cdc_name} ADD COLUMN extra int")
        lsql(f"INSERT INTO {cdc_name} VALUES (1, 1, 1)")
        end = src.latest_offset(start, ReadLimit.all_available())
        with pytest.raises(Exception, match=r"column 'extra' .*restart the query"):
            read(src, start, end)
        src.close()
        src = make_source(cdc_options, snapshotMode="never")  # a restart picks the new column up
        rows = read(src, start, end).to_pylist()
        assert [(r["id"], r["extra"]) for r in rows] == [(1, 1)]
        lsql("SELECT pg_drop_replication_slot(%s)", (cdc_options["slotName"],))
        with pytest.raises(Exception, match=r"does not exist any more .*snapshotMode=initial"):
            src.latest_offset(end, ReadLimit.all_available())
    finally:
        src.close()


def test_wal_level_replica_is_refused_with_the_fix(tmp_path: Path) -> None:
    from tests.services.fixtures import serve

    gen = serve(Postgres(settings={"wal_level": "replica"}))
    pg = next(gen)
    try:
        import psycopg

        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute("CREATE TABLE t (id int PRIMARY KEY)")
        with pytest.raises(Exception, match=r"wal_level=replica.*wal_level=logical"):
            make_source({"url": pg.dsn, "dbtable": "t"})
    finally:
        gen.close()


def test_partitions_pickle(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY)")
    src = make_source(cdc_options, snapshotMode="never")
    try:
        start = src.initial_offset()
        lsql(f"INSERT INTO {cdc_name} SELECT generate_series(1, 5)")
        end = src.latest_offset(start, ReadLimit.all_available())
        copy = pickle.loads(pickle.dumps(src))
        parts = pickle.loads(pickle.dumps(list(src.partitions(start, end))))
        assert sum(b.num_rows for p in parts for b in copy.read(p)) == 5
        copy.close()
    finally:
        src.close()


def test_slot_invalidated_by_max_slot_wal_keep_size_fails_clearly() -> None:
    from tests.services.fixtures import serve
    from tests.services.postgres import LOGICAL_SETTINGS

    gen = serve(Postgres(settings={**LOGICAL_SETTINGS, "fsync": "off", "synchronous_commit": "off",
                                   "max_slot_wal_keep_size": "1MB", "max_wal_size": "32MB", "min_wal_size": "32MB"}))  # fmt: skip
    pg = next(gen)
    try:
        import psycopg

        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute("CREATE TABLE t (id int PRIMARY KEY)")
            src = make_source({"url": pg.dsn, "dbtable": "t"}, snapshotMode="never")
            start = src.initial_offset()
            c.execute("INSERT INTO t VALUES (1)")
            for _ in range(4):  # move WAL on by whole segments, then let a checkpoint remove them
                c.execute("CREATE TABLE junk AS SELECT repeat('x', 2000) AS s FROM generate_series(1, 4000)")
                c.execute("DROP TABLE junk")
                c.execute("SELECT pg_switch_wal()")
            c.execute("CHECKPOINT")
            status = c.execute("SELECT wal_status FROM pg_replication_slots").fetchone()
            assert status is not None and status[0] in ("lost", "unreserved"), status
            if status[0] == "unreserved":
                c.execute("CHECKPOINT")
        with pytest.raises(Exception, match=r"invalidated") as info:
            src.latest_offset(start, ReadLimit.all_available())
        assert "snapshotMode=initial" in str(info.value)
        src.close()
    finally:
        gen.close()


def test_available_now_reads_every_change_committed_before_it_starts(tmp_path: Path) -> None:
    """Commits acknowledged but not yet flushed (synchronous_commit=off; the WAL writer flushes
    the last partial page only every wal_writer_delay) are read by an available-now run that
    starts right after them, not left for the next run."""
    import headrace as hr
    from tests.services.fixtures import serve
    from tests.services.postgres import LOGICAL_SETTINGS

    gen = serve(Postgres(settings={**LOGICAL_SETTINGS, "synchronous_commit": "off", "wal_writer_delay": "10s"}))
    pg = next(gen)
    opts = {"url": pg.dsn, "dbtable": "t", "slotName": "s_avail", "publicationName": "p_avail"}

    def run() -> int:
        q = (hr.read_stream.format("postgresql").options(opts).load()
             .write_stream.format("memory").query_name("avail")
             .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start())  # fmt: skip
        q.await_termination()
        return sum(int(p["numInputRows"]) for p in q.recent_progress)

    try:
        import psycopg

        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
            c.execute("INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
            assert run() == 10  # the snapshot
            for round_ in range(3):
                for i in range(1, 11):  # ten acknowledged commits: 40 messages in the slot, with their relation
                    c.execute("UPDATE t SET v = v + 1 WHERE id = %s", (i,))
                assert run() == 20, f"round {round_}"  # each update: its pre- and post-image
    finally:
        gen.close()

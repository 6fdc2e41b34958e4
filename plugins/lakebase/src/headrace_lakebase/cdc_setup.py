"""The change source's catalog work: the table's description, the checks (``wal_level``,
replica identity, privileges), and creating the publication and the replication slot.

Every statement quotes identifiers with ``psycopg.sql`` and binds values. Errors name the
missing setting or privilege and the fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from headrace.errors import HeadraceError
from headrace_lakebase._options import TableName
from headrace_lakebase.pgoutput import parse_lsn
from headrace_lakebase.pgread import PgColumn

__all__ = ["ReplicationSetupError", "SlotState", "TableInfo", "describe_table", "ensure_publication", "ensure_slot",
           "slot_state"]  # fmt: skip

log = logging.getLogger(__name__)

Conn = psycopg.Connection[tuple[object, ...]]


class ReplicationSetupError(HeadraceError):
    """Logical replication cannot be used as configured (setting, privilege, slot, table)."""


@dataclass(frozen=True)
class TableInfo:
    """What the source needs to know about its table."""

    table: TableName
    relid: int
    columns: tuple[PgColumn, ...]
    primary_key: tuple[str, ...]
    replica_identity: str  # d, n, f, i
    toastable: tuple[str, ...]  # columns whose values may be stored out of line


def describe_table(conn: Conn, table: TableName) -> TableInfo:
    """Columns (domains resolved to their base type, arrays to their element type), primary
    key, replica identity and TOAST-able columns of ``table``. Raises when it is missing."""
    row = conn.execute(
        "SELECT c.oid::int, c.relreplident::text, c.relkind::text FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (table.schema, table.table),
    ).fetchone()
    if row is None:
        raise ReplicationSetupError(f"lakebase source: table {table} does not exist; create it or fix dbtable")
    relid, ident, kind = int(row[0]), str(row[1]), str(row[2])  # type: ignore[call-overload]
    if kind not in ("r", "p"):
        raise ReplicationSetupError(f"lakebase source: {table} is not a table (relkind {kind!r}); point dbtable at a table")
    cols = conn.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod),
                  (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END)::int AS base,
                  a.atttypmod, t.typstorage::text,
                  (SELECT e.oid FROM pg_type b JOIN pg_type e ON e.oid = b.typelem
                    WHERE b.oid = (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END)
                      AND b.typcategory = 'A')::int AS elem
           FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
           WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
           ORDER BY a.attnum""",
        (relid,),
    ).fetchall()
    columns = tuple(PgColumn(str(r[0]), int(r[2]), int(r[3]), int(r[5] or 0), str(r[1])) for r in cols)  # type: ignore[call-overload]
    toastable = tuple(str(r[0]) for r in cols if str(r[4]) != "p")
    pk = conn.execute(
        """SELECT a.attname FROM pg_index i
           CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
           WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord""",
        (relid,),
    ).fetchall()
    return TableInfo(table, relid, columns, tuple(str(r[0]) for r in pk), ident, toastable)


def check_table(info: TableInfo, *, needs_key: bool) -> None:
    """Refuse tables whose changes could not be streamed without loss, before any I/O that
    changes state. ``needs_key``: the initial snapshot reads in primary-key ranges."""
    t = info.table
    if info.replica_identity == "n":
        raise ReplicationSetupError(
            f"lakebase source: {t} has REPLICA IDENTITY NOTHING, so its updates and deletes carry no row to "
            f"identify; fix: ALTER TABLE {t} REPLICA IDENTITY FULL"
        )
    if info.toastable and info.replica_identity != "f":
        raise ReplicationSetupError(
            f"lakebase source: {t} has columns whose large values PostgreSQL stores out of line (TOAST: "
            f"{', '.join(info.toastable)}); an update that does not change such a value does not send it, so "
            f"the source fills it from the row's old image, which needs REPLICA IDENTITY FULL. "
            f"Fix: ALTER TABLE {t} REPLICA IDENTITY FULL"
        )
    if info.replica_identity == "d" and not info.primary_key:
        raise ReplicationSetupError(
            f"lakebase source: {t} has no primary key, so its updates and deletes carry no row to identify; "
            f"fix: add a primary key, or ALTER TABLE {t} REPLICA IDENTITY FULL"
        )
    if needs_key and not info.primary_key:
        raise ReplicationSetupError(
            f"lakebase source: the initial snapshot of {t} reads it in primary-key ranges, but it has no primary "
            "key; fix: add one, or set snapshotMode=never (and load the existing rows another way)"
        )


def check_wal_level(conn: Conn) -> None:
    """``wal_level`` must be ``logical``."""
    level = conn.execute("SHOW wal_level").fetchone()
    if level is None or str(level[0]) != "logical":
        raise ReplicationSetupError(
            f"lakebase source: PostgreSQL runs with wal_level={level[0] if level else '?'}, and logical replication "
            "needs wal_level=logical; fix: ALTER SYSTEM SET wal_level = logical (also max_replication_slots >= 1 "
            "and max_wal_senders >= 1) and restart PostgreSQL (on Lakebase/managed services: enable logical "
            "replication in the instance settings)"
        )


def ensure_publication(conn: Conn, name: str, info: TableInfo) -> None:
    """Create publication ``name`` FOR TABLE the table when it does not exist; check that an
    existing one publishes the table with inserts, updates, deletes and truncates."""
    row = conn.execute(
        "SELECT pubinsert AND pubupdate AND pubdelete, puballtables FROM pg_publication WHERE pubname = %s", (name,)
    ).fetchone()
    if row is None:
        try:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                    sql.Identifier(name), sql.Identifier(info.table.schema, info.table.table)
                )
            )
        except psycopg.errors.DuplicateObject:
            pass  # created concurrently
        except psycopg.errors.InsufficientPrivilege as e:
            raise ReplicationSetupError(
                f"lakebase source: cannot create publication {name}: {str(e).strip()}. CREATE PUBLICATION needs the "
                f"CREATE privilege on the database and ownership of {info.table}; fix: GRANT CREATE ON DATABASE ... "
                f"TO the user and make it the table's owner, or have an administrator run "
                f"CREATE PUBLICATION {name} FOR TABLE {info.table}"
            ) from None
        log.info("lakebase source: created publication %s for %s", name, info.table)
        return
    if not row[0]:
        raise ReplicationSetupError(
            f"lakebase source: publication {name} does not publish all of insert, update and delete; fix: "
            f"ALTER PUBLICATION {name} SET (publish = 'insert, update, delete, truncate')"
        )
    if not row[1]:
        listed = conn.execute(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
            (name, info.table.schema, info.table.table),
        ).fetchone()
        if listed is None:
            raise ReplicationSetupError(
                f"lakebase source: publication {name} exists but does not include {info.table}; fix: "
                f"ALTER PUBLICATION {name} ADD TABLE {info.table}, or choose another publicationName"
            )


@dataclass(frozen=True)
class SlotState:
    plugin: str
    database: str
    confirmed_flush: int
    restart_lsn: int
    wal_status: str  # reserved, extended, unreserved, lost (PG 13+)


def slot_state(conn: Conn, name: str) -> SlotState | None:
    """The slot's row in ``pg_replication_slots``, or None when it does not exist."""
    row = conn.execute(
        "SELECT coalesce(plugin, ''), coalesce(database::text, ''), confirmed_flush_lsn::text, restart_lsn::text, "
        "coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = %s",
        (name,),
    ).fetchone()
    if row is None:
        return None
    return SlotState(
        str(row[0]), str(row[1]), parse_lsn(str(row[2])) if row[2] else 0, parse_lsn(str(row[3])) if row[3] else 0,
        str(row[4]),
    )  # fmt: skip


def ensure_slot(conn: Conn, name: str, database: str) -> SlotState:
    """Create logical slot ``name`` (pgoutput) when it does not exist; check an existing one."""
    state = slot_state(conn, name)
    if state is None:
        try:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (name,))
        except psycopg.errors.DuplicateObject:
            pass
        except psycopg.errors.InsufficientPrivilege as e:
            raise ReplicationSetupError(
                f"lakebase source: cannot create replication slot {name}: {str(e).strip()}. Fix: give the user the "
                "REPLICATION attribute (ALTER ROLE <user> WITH REPLICATION) or have an administrator run "
                f"SELECT pg_create_logical_replication_slot('{name}', 'pgoutput')"
            ) from None
        except psycopg.errors.ObjectNotInPrerequisiteState as e:
            raise ReplicationSetupError(
                f"lakebase source: cannot create replication slot {name}: {str(e).strip()}. Fix: wal_level=logical "
                "and max_replication_slots above the slots in use, then restart PostgreSQL"
            ) from None
        except psycopg.errors.ConfigurationLimitExceeded as e:
            raise ReplicationSetupError(
                f"lakebase source: cannot create replication slot {name}: {str(e).strip()}. Fix: drop unused slots "
                "(SELECT pg_drop_replication_slot(name) FROM pg_replication_slots WHERE NOT active) or raise "
                "max_replication_slots and restart PostgreSQL"
            ) from None
        log.info("lakebase source: created logical replication slot %s (pgoutput)", name)
        state = slot_state(conn, name)
        assert state is not None
    check_slot(state, name, database)
    return state


def check_slot(state: SlotState, name: str, database: str) -> None:
    if state.plugin != "pgoutput":
        raise ReplicationSetupError(
            f"lakebase source: replication slot {name} uses output plugin {state.plugin or '(physical slot)'}, not "
            "pgoutput; choose another slotName"
        )
    if database and state.database and state.database != database:
        raise ReplicationSetupError(
            f"lakebase source: replication slot {name} belongs to database {state.database}, not {database}; "
            "choose another slotName"
        )
    if state.wal_status == "lost":
        raise ReplicationSetupError(
            f"lakebase source: replication slot {name} was invalidated (wal_status 'lost': PostgreSQL removed WAL it "
            "still needed, e.g. past max_slot_wal_keep_size); the changes since its position are gone and the "
            f"mirror cannot be kept exact. Fix: drop the slot (SELECT pg_drop_replication_slot('{name}')), delete "
            "the query's checkpoint and start again with snapshotMode=initial to reload the table"
        )

"""Reading and advancing the change source's replication slot (plain SQL: peek, advance).

``peek`` checks the slot first: gone (dropped), past the query's position (another consumer),
invalidated (``max_slot_wal_keep_size``) all fail with the fix, never with silent loss.
"""

from __future__ import annotations

import psycopg

from headrace_lakebase._options import TableName
from headrace_lakebase.cdc_setup import ReplicationSetupError, SlotState, check_slot, slot_state
from headrace_lakebase.pgoutput import format_lsn

__all__ = ["advance_slot", "check_position", "peek"]

Conn = psycopg.Connection[tuple[object, ...]]


def advance_slot(conn: Conn, slot: str, lsn: int) -> None:
    """Move the slot's confirmed position to ``lsn`` (PostgreSQL caps it at the flushed WAL)."""
    conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, format_lsn(lsn)))


def check_position(state: SlotState | None, slot: str, table: TableName, database: str, position: int) -> None:
    """The slot exists, is valid, and still holds the changes after ``position``."""
    if state is None:
        raise ReplicationSetupError(
            f"lakebase source: replication slot {slot} does not exist any more (dropped?): the changes of "
            f"{table} after LSN {format_lsn(position)} cannot be read, so the mirror cannot be kept exact. "
            "Fix: delete the query's checkpoint (and the target's rows) and start again with snapshotMode=initial"
        )
    check_slot(state, slot, database)
    if state.confirmed_flush > position > 0:
        raise ReplicationSetupError(
            f"lakebase source: replication slot {slot} is at LSN {format_lsn(state.confirmed_flush)}, past "
            f"this query's position {format_lsn(position)}: another consumer used the slot and the changes in "
            "between are gone. Fix: give each query its own slotName; reload with a new checkpoint and "
            "snapshotMode=initial"
        )


def peek(conn: Conn, slot: str, publication: str, table: TableName, database: str, start: int, upto_lsn: int | None,
         upto_n: int | None, *, advance_to: int | None) -> list[tuple[int, bytes]]:  # fmt: skip
    """``(lsn, message)`` pairs from ``pg_logical_slot_peek_binary_changes`` (nothing consumed),
    at most up to ``upto_lsn`` / about ``upto_n`` messages (whole transactions)."""
    state = slot_state(conn, slot)
    check_position(state, slot, table, database, start)
    assert state is not None
    if advance_to is not None and state.confirmed_flush < advance_to:
        advance_slot(conn, slot, advance_to)
    try:
        cur = conn.execute(
            "SELECT (lsn - '0/0'::pg_lsn)::bigint, data FROM pg_logical_slot_peek_binary_changes(%s, %s::pg_lsn, %s, "
            "'proto_version', '1', 'publication_names', %s)",
            (slot, format_lsn(upto_lsn) if upto_lsn is not None else None, upto_n, publication),
        )
    except psycopg.errors.ObjectNotInPrerequisiteState as e:
        raise ReplicationSetupError(
            f"lakebase source: replication slot {slot} cannot be read: {str(e).strip()}. If it was invalidated "
            "(max_slot_wal_keep_size), the changes since its position are gone: drop the slot, delete the "
            "checkpoint and start again with snapshotMode=initial"
        ) from None
    except psycopg.errors.UndefinedObject as e:
        raise ReplicationSetupError(
            f"lakebase source: {str(e).strip()}. Either the publication was dropped, or the slot was created before "
            "the publication (changes older than a publication cannot be decoded with it). Fix: "
            f"CREATE PUBLICATION {publication} FOR TABLE {table} before creating the slot, or let the source create both"
        ) from None
    return cur.fetchall()  # type: ignore[return-value]

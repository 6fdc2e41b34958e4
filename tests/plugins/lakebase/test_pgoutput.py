"""The pgoutput decoder on messages from a real server, and on malformed input."""

# ruff: noqa: F811  (pytest fixtures imported from cdc_helpers)
from __future__ import annotations

from typing import Any

import pytest

from headrace_lakebase.pgoutput import (
    UNCHANGED,
    Begin,
    Change,
    Commit,
    PgOutputError,
    Relation,
    Truncate,
    decode,
    format_lsn,
    parse_lsn,
)
from tests.plugins.lakebase.cdc_helpers import Sql, cdc_name, cdc_options, lsql  # noqa: F401


def test_lsn_text_round_trip() -> None:
    assert format_lsn(parse_lsn("16/B374D848")) == "16/B374D848"
    assert parse_lsn("0/0") == 0


def test_messages_of_a_real_server(cdc_options: dict[str, Any], cdc_name: str, lsql: Sql) -> None:
    slot, pub = cdc_options["slotName"], cdc_options["publicationName"]
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, big text, n int)")
    lsql(f"ALTER TABLE {cdc_name} REPLICA IDENTITY FULL")
    lsql(f"ALTER TABLE {cdc_name} ALTER COLUMN big SET STORAGE EXTERNAL")
    lsql(f"CREATE PUBLICATION {pub} FOR TABLE {cdc_name}")
    lsql("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    lsql(f"INSERT INTO {cdc_name} VALUES (1, %s, NULL)", ("y" * 50_000,))
    lsql(f"UPDATE {cdc_name} SET n = 2")
    lsql(f"DELETE FROM {cdc_name}")
    lsql(f"TRUNCATE {cdc_name}")
    rows = lsql("SELECT data FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, 'proto_version', '1', "
                "'publication_names', %s)", (slot, pub))  # fmt: skip
    msgs = [decode(bytes(r[0])) for r in rows]
    rel = next(m for m in msgs if isinstance(m, Relation))
    assert (rel.name, rel.replica_identity, [c.name for c in rel.columns]) == (cdc_name, "f", ["id", "big", "n"])
    assert [c.is_key for c in rel.columns] == [True, True, True]  # FULL: every column identifies the row
    changes = [m for m in msgs if isinstance(m, Change)]
    ins, upd, dele = changes
    assert ins.op == "I" and ins.new == (b"1", b"y" * 50_000, None)
    assert upd.op == "U" and upd.old_kind == "O" and upd.new == (b"1", UNCHANGED, b"2")
    assert upd.old == (b"1", b"y" * 50_000, None)  # the whole old row, TOASTed value included
    assert dele.op == "D" and dele.old_kind == "O" and dele.old == (b"1", b"y" * 50_000, b"2")
    assert any(isinstance(m, Truncate) and rel.relid in m.relids for m in msgs)
    begins = [m for m in msgs if isinstance(m, Begin)]
    commits = [m for m in msgs if isinstance(m, Commit)]
    assert len(begins) == len(commits) == 4
    assert all(b.final_lsn == c.commit_lsn < c.end_lsn for b, c in zip(begins, commits, strict=True))


@pytest.mark.parametrize(
    "data, match",
    [(b"", "empty"), (b"I\x00\x00", "malformed"), (b"Z", "unknown pgoutput message type"),
     (b"I\x00\x00\x00\x01N\x00\x01x", "unknown tuple column kind")],
    ids=["empty", "truncated", "unknown-type", "bad-column-kind"],
)  # fmt: skip
def test_malformed_input_is_refused(data: bytes, match: str) -> None:
    with pytest.raises(PgOutputError, match=match):
        decode(data)

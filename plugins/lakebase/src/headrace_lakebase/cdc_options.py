"""The options of the ``lakebase`` change source (PostgreSQL logical replication), declared once.

Connection options are the sink's (same names, same meaning). Importing this module imports no
client library and does no I/O.
"""

from __future__ import annotations

from headrace.options import Choice, Duration, Integer, Option, OptionSchema, String, at_most_one_of
from headrace_lakebase._options import IDENTIFIER, SINK_OPTIONS

__all__ = ["SOURCE_OPTIONS"]

_CONNECTION = ("database", "endpoint", "url", "host", "port", "user", "password", "sslmode", "maxRetries",
               "connectTimeout")  # fmt: skip


def _shared(name: str) -> Option:
    opt = SINK_OPTIONS.get(name)
    assert opt is not None, name
    return opt


_NAME = String(pattern=IDENTIFIER, hint="a plain identifier: a letter or underscore, then letters, digits, underscores")

SOURCE_OPTIONS = OptionSchema(
    [
        Option(
            "dbtable",
            _shared("dbtable").type,
            required=True,
            doc="The table whose changes are streamed, 'schema.table' (schema defaults to public). It needs a "
            "primary key for the initial snapshot, and REPLICA IDENTITY FULL when it has TOAST-able columns "
            "(text, bytea, jsonb, arrays, numeric).",
        ),
        Option(
            "slotName",
            _NAME,
            doc="The logical replication slot (pgoutput); created when absent. Default headrace_<schema>_<table>. "
            "One slot per stream: two queries must not share a slot.",
        ),
        Option(
            "publicationName",
            _NAME,
            doc="The publication of the table; created (FOR TABLE dbtable) when absent. Default "
            "headrace_<schema>_<table>.",
        ),
        Option(
            "snapshotMode",
            Choice("initial", "never", "initial_only"),
            default="initial",
            doc="initial: the table's rows first (as inserts, consistent with the slot's start), then its "
            "changes; never: changes only, from the slot's position; initial_only: the rows, then the stream ends.",
        ),
        Option(
            "maxChangesPerTrigger",
            Integer(min=1),
            default=100000,
            doc="A batch peeks at most this many replication messages (each change, plus a begin and a commit "
            "per transaction), cut after the last whole transaction (at least one). Bounds a batch's memory.",
        ),
        Option(
            "snapshotChunkRows",
            Integer(min=1),
            default=20000,
            doc="headrace extension: rows per batch of the initial snapshot (key ranges, read in key order).",
        ),
        Option(
            "onTruncate",
            Choice("fail", "ignore"),
            default="fail",
            doc="headrace extension: what a TRUNCATE of the table does: fail (the query stops with an error "
            "naming the LSN; the mirror must be reloaded) or ignore (logged; rows stay in the mirror).",
        ),
        Option(
            "pollInterval",
            Duration(min=0.001),
            default=0.05,
            doc="headrace extension: how often the real-time trigger asks the slot for new changes.",
        ),
        *(_shared(n) for n in _CONNECTION),
    ],
    rules=[at_most_one_of("url", "host", "endpoint")],
)
"""Options of the ``lakebase`` (alias ``postgresql``) change source."""

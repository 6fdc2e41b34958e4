"""Option declarations of the ``sqlite`` connector: names, types, defaults, docs.

Declarations only: no I/O and no client library here, so ``headrace describe sqlite`` and
option validation stay cheap. Each option is a typed handle: ``options[MAX_ROWS]`` is an int.
"""

from __future__ import annotations

from headrace.options import Integer, Option, OptionSchema, String

__all__ = ["KEY_COLUMN", "MAX_ROWS", "NUM_PARTITIONS", "SOURCE_OPTIONS", "SINK_OPTIONS", "PATH", "TABLE"]

PATH = Option[str]("path", String(), required=True, doc="The SQLite database file.")
TABLE = Option[str]("table", String(pattern=r"[A-Za-z_][A-Za-z0-9_]*", hint="a plain identifier"), default="events",
                    doc="The table to read or write.")  # fmt: skip
KEY_COLUMN = Option[str]("keyColumn", String(pattern=r"[A-Za-z_][A-Za-z0-9_]*", hint="a plain identifier"),
                         default="id", doc="An INTEGER column that grows with every new row (e.g. the rowid alias "
                         "INTEGER PRIMARY KEY AUTOINCREMENT); rows are read in its order.")  # fmt: skip
MAX_ROWS = Option[int]("maxRowsPerTrigger", Integer(min=1), read_limit="max_rows",
                       doc="At most this many rows per micro-batch (default: everything available).")  # fmt: skip
NUM_PARTITIONS = Option[int]("numPartitions", Integer(min=1, max=64), default=2,
                             doc="Read each batch in this many key ranges, in parallel.")  # fmt: skip

SOURCE_OPTIONS = OptionSchema([PATH, TABLE, KEY_COLUMN, MAX_ROWS, NUM_PARTITIONS])
SINK_OPTIONS = OptionSchema([PATH, TABLE])

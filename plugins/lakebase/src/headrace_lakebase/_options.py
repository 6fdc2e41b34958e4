"""The options of the ``lakebase`` sink, declared once (names are the reference's, matched
case-insensitively). Importing this module imports no client library and does no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from headrace.errors import OptionProblem
from headrace.options import (
    Choice,
    Duration,
    Integer,
    Option,
    Options,
    OptionSchema,
    String,
    StringList,
    at_most_one_of,
    rule,
)

__all__ = ["IDENTIFIER", "SINK_OPTIONS", "TableName", "parse_dbtable"]

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
"""A plain SQL identifier: a letter or underscore, then letters, digits and underscores."""

_DBTABLE = re.compile(rf"(?:({IDENTIFIER})\.)?({IDENTIFIER})")
_ENDPOINT = r"[A-Za-z0-9][A-Za-z0-9_-]*\.[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9][A-Za-z0-9_-]*)?"


@dataclass(frozen=True)
class TableName:
    """A validated ``schema.table``. Both parts are plain identifiers, folded to lower case as
    PostgreSQL folds unquoted names (so ``Events`` and ``events`` are the same table)."""

    schema: str
    table: str

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}"


def parse_dbtable(text: str) -> TableName:
    """``"schema.table"`` or ``"table"`` (schema ``public``) as a :class:`TableName`.

    Raises ValueError naming the bad value and the rule when a part is not a plain identifier
    (quotes, semicolons, hyphens, spaces, dots inside names are rejected).
    """
    m = _DBTABLE.fullmatch(text.strip())
    if not m:
        raise ValueError(
            f"{text!r} is not 'schema.table' made of plain identifiers (a letter or underscore, then "
            "letters, digits or underscores; no quotes, semicolons, hyphens or spaces); e.g. 'public.events'"
        )
    return TableName((m.group(1) or "public").lower(), m.group(2).lower())


class _DbTable(String):
    label = "schema.table"

    def parse(self, value: object) -> TableName:
        if isinstance(value, TableName):
            return value
        return parse_dbtable(str(super().parse(value)))

    def render(self, value: object) -> str:
        return str(value)


class _Url(String):
    label = "a postgresql:// URL"


@rule("upsertkey column names are non-empty and unique")
def _keys_unique(opts: Options) -> list[OptionProblem]:
    keys = opts["upsertkey"]
    if not keys:
        return []
    dup = sorted({k for k in keys if keys.count(k) > 1})
    return [OptionProblem("upsertkey", f"names {', '.join(dup)} more than once; list each key column once")] if dup else []


SINK_OPTIONS = OptionSchema(
    [
        Option(
            "dbtable",
            _DbTable(),
            required=True,
            doc="Target table 'schema.table' (schema defaults to public); plain identifiers only. "
            "Created from the data's schema when missing.",
        ),
        Option(
            "database",
            String(),
            default="databricks_postgres",
            doc="Database name. With `url`, the url's database is used unless this is set.",
        ),
        Option(
            "upsertkey",
            StringList(min_items=1),
            doc="Comma-separated key columns: INSERT ... ON CONFLICT (keys) DO UPDATE. Must equal the "
            "table's primary key exactly. Unset: the primary key of an existing table, else plain inserts.",
        ),
        Option("batchsize", Integer(min=1), default=1000, doc="Rows per transaction (chunk)."),
        Option(
            "batchinterval",
            Duration(min=0.001),
            default=0.1,
            doc="The longest a row waits in the buffer before it is flushed ('100 milliseconds').",
        ),
        Option(
            "endpoint",
            String(pattern=_ENDPOINT, hint="write it as 'project_id.branch_id' or 'project_id.branch_id.endpoint_id'"),
            doc="Lakebase endpoint 'project_id.branch_id[.endpoint_id]', resolved by a plugin implementing "
            "the headrace_lakebase_resolve_endpoint hook (e.g. Databricks authentication).",
        ),
        Option(
            "url",
            _Url(pattern=r"postgres(ql)?://.*", hint="a libpq URL such as postgresql://user@host:5432/db"),
            secret=True,
            doc="headrace extension: a libpq connection URL postgresql://user:password@host:port/db?sslmode=...",
        ),
        Option("host", String(), doc="headrace extension: PostgreSQL host name or address."),
        Option("port", Integer(min=1, max=65535), doc="headrace extension: PostgreSQL port (default 5432)."),
        Option("user", String(), doc="headrace extension: user name."),
        Option("password", String(), secret=True, doc="headrace extension: password."),
        Option(
            "sslmode",
            Choice("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
            doc="headrace extension: libpq sslmode.",
        ),
        Option(
            "maxRetries",
            Integer(min=0),
            default=10,
            doc="headrace extension: retries of a chunk after a transient error (connection loss, admin "
            "shutdown, deadlock, serialization failure, too many connections), with exponential backoff "
            "and jitter; then the query fails.",
        ),
        Option(
            "connectTimeout",
            Duration(min=0.1),
            default=10.0,
            doc="headrace extension: timeout of one connection attempt ('10 seconds').",
        ),
    ],
    rules=[at_most_one_of("url", "host", "endpoint"), _keys_unique],
)
"""Options of the ``lakebase`` (alias ``postgresql``) sink."""

# Typed handles: options[HANDLE] is typed (string keys keep working).
BATCHINTERVAL: Option[float] = SINK_OPTIONS["batchinterval"]
BATCHSIZE: Option[int] = SINK_OPTIONS["batchsize"]
CONNECT_TIMEOUT: Option[float] = SINK_OPTIONS["connectTimeout"]
DATABASE: Option[str] = SINK_OPTIONS["database"]
DBTABLE: Option[Any] = SINK_OPTIONS["dbtable"]
ENDPOINT: Option[str | None] = SINK_OPTIONS["endpoint"]
HOST: Option[str | None] = SINK_OPTIONS["host"]
MAX_RETRIES: Option[int] = SINK_OPTIONS["maxRetries"]
PASSWORD: Option[str | None] = SINK_OPTIONS["password"]
PORT: Option[int | None] = SINK_OPTIONS["port"]
SSLMODE: Option[str | None] = SINK_OPTIONS["sslmode"]
UPSERTKEY: Option[list[str] | None] = SINK_OPTIONS["upsertkey"]
URL: Option[Any] = SINK_OPTIONS["url"]
USER: Option[str | None] = SINK_OPTIONS["user"]
__all__ += ["BATCHINTERVAL", "BATCHSIZE", "CONNECT_TIMEOUT", "DATABASE", "DBTABLE", "ENDPOINT", "HOST", "MAX_RETRIES", "PASSWORD", "PORT", "SSLMODE", "UPSERTKEY", "URL", "USER"]

"""The options of the ``lakebase`` sink, declared once (names are the reference's, matched
case-insensitively). Importing this module imports no client library and does no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from headrace.errors import OptionProblem
from headrace.helpers.auto_cdc import AUTO_CDC_OPTIONS, AUTO_CDC_RULES
from headrace.helpers.badrecords import BAD_RECORD_OPTIONS
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

__all__ = ["IDENTIFIER", "MAX_IDENTIFIER_BYTES", "SINK_OPTIONS", "TableName", "identifier_problem", "parse_dbtable", "url_port_problem"]

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
"""A plain SQL identifier: a letter or underscore, then letters, digits and underscores."""

MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL's limit (NAMEDATALEN - 1): a longer name is silently truncated by the server, so
the table created, or the column keyed on, would not be the one named."""


def identifier_problem(name: str, what: str) -> str | None:
    """Why ``name`` cannot be a PostgreSQL identifier (empty, or longer than 63 bytes), or None."""
    if not name:
        return f"{what} is empty; give a name"
    size = len(name.encode("utf-8"))
    if size > MAX_IDENTIFIER_BYTES:
        return (
            f"{what} {name[:20]!r}... is {size} bytes long; PostgreSQL identifiers are at most "
            f"{MAX_IDENTIFIER_BYTES} bytes (longer ones are silently truncated): use a shorter name"
        )
    return None

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
    name = TableName((m.group(1) or "public").lower(), m.group(2).lower())
    for part, what in ((name.schema, "the schema name"), (name.table, "the table name")):
        problem = identifier_problem(part, what)
        if problem:
            raise ValueError(problem)
    return name


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


def url_port_problem(url: str) -> str | None:
    """Why the port(s) of a libpq URL are not valid, or None. Never quotes the URL or the
    port text (a mistyped URL can put the password there)."""
    from urllib.parse import parse_qsl

    rest = url.split("://", 1)[1] if "://" in url else url
    authority = rest.partition("/")[0]
    authority = authority.partition("?")[0].rpartition("@")[2]
    ports = []
    for host in authority.split(","):
        if host.startswith("["):  # [IPv6]:port
            ports.append(host.partition("]")[2].removeprefix(":") if "]" in host else "")
        elif ":" in host:
            ports.append(host.rpartition(":")[2])
    query = rest.partition("?")[2]
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "port":
            ports.extend(value.split(","))
    for port in ports:
        if port == "":
            continue
        if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
            return (
                "the port in the URL is not a number from 1 to 65535 (if the password holds ':', '@' or '/', "
                "percent-encode it); write it as postgresql://user:password@host:5432/db"
            )
    return None


@rule("the port of url is a number")
def _url_port(opts: Options) -> list[OptionProblem]:
    if not opts.is_set("url"):
        return []
    problem = url_port_problem(str(opts.reveal("url")))
    return [OptionProblem("url", problem)] if problem else []


@rule("upsertkey column names are non-empty, at most 63 bytes and unique")
def _keys_unique(opts: Options) -> list[OptionProblem]:
    keys = opts["upsertkey"]
    if not keys:
        return []
    problems = [OptionProblem("upsertkey", p) for k in keys if (p := identifier_problem(k, "the key column name"))]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        problems.append(OptionProblem("upsertkey", f"names {', '.join(dup)} more than once; list each key column once"))
    return problems


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
            aliases=("keys",),
            doc="Comma-separated key columns: INSERT ... ON CONFLICT (keys) DO UPDATE. Must equal the "
            "table's primary key exactly. Unset: the primary key of an existing table, else plain inserts.",
        ),
        Option(
            "batchsize",
            Integer(min=1),
            default=100000,
            doc="Rows per transaction (chunk), at most. Default 100,000 (Databricks: 1,000), see the README.",
        ),
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
        *AUTO_CDC_OPTIONS,
        Option(
            "tombstoneRetention",
            Duration(min=0.0),
            default="2 days",
            doc="AUTO CDC with sequenceBy: how long a deleted key's sequence is kept (in the table "
            "<schema>._headrace_tomb_<table>) so that an older event arriving after the delete does not bring "
            "the row back; 0 keeps none (headrace extension, the counterpart of "
            "pipelines.cdc.tombstoneGCThresholdInSeconds).",
        ),
    ],
    rules=[at_most_one_of("url", "host", "endpoint"), _keys_unique, _url_port, *AUTO_CDC_RULES],
)
"""Options of the ``lakebase`` (alias ``postgresql``) sink."""

# one bad-record policy for every sink that can reject a row (headrace.badrecords)
SINK_OPTIONS = SINK_OPTIONS.extended(BAD_RECORD_OPTIONS.options, rules=BAD_RECORD_OPTIONS.rules)
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
TOMBSTONE_RETENTION: Option[float] = SINK_OPTIONS["tombstoneRetention"]
UPSERTKEY: Option[list[str] | None] = SINK_OPTIONS["upsertkey"]
URL: Option[Any] = SINK_OPTIONS["url"]
USER: Option[str | None] = SINK_OPTIONS["user"]
__all__ += ["BATCHINTERVAL", "BATCHSIZE", "CONNECT_TIMEOUT", "DATABASE", "DBTABLE", "ENDPOINT", "HOST", "MAX_RETRIES", "PASSWORD", "PORT", "SSLMODE", "TOMBSTONE_RETENTION", "UPSERTKEY", "URL", "USER"]

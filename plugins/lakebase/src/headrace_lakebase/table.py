"""The target table: introspection, creation from an Arrow schema, upsert-key resolution, and
the SQL of one chunk (all identifiers quoted with ``psycopg.sql.Identifier``; values are only
ever bound or copied)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
import pyarrow as pa
from psycopg import sql

from headrace.errors import HeadraceError
from headrace_lakebase._options import TableName, identifier_problem
from headrace_lakebase.copy_binary import FAST_OIDS
from headrace_lakebase.pgtypes import ColumnInfo, arrow_to_pg, fits, is_comparable

__all__ = ["SchemaMismatchError", "TablePlan", "UpsertKeyError", "plan_table", "read_columns", "read_primary_key"]


class SchemaMismatchError(HeadraceError):
    """The data's columns do not fit the existing table."""


class UpsertKeyError(HeadraceError):
    """``upsertkey`` is not the table's primary key, or not usable as a key."""


@dataclass(frozen=True)
class TablePlan:
    """How one writer's data goes into the table: the data's columns (in data order) with their
    target type oids, the upsert keys (empty: plain inserts), and whether the vectorised COPY
    encoder handles every column."""

    table: TableName
    columns: tuple[str, ...]
    oids: tuple[int, ...]
    keys: tuple[str, ...]
    created: bool

    @property
    def fast(self) -> bool:
        return all(o in FAST_OIDS for o in self.oids)

    @property
    def ident(self) -> sql.Composable:
        return sql.Identifier(self.table.schema, self.table.table)

    def staging_name(self) -> str:
        return f"_headrace_stage_{abs(hash((self.table, self.columns))) % 10**12}"

    def create_staging(self) -> sql.Composed:
        """A session-local staging table with the target's column types, emptied at commit."""
        return sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {stage} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {target} WITH NO DATA"
        ).format(stage=sql.Identifier(self.staging_name()), cols=self._cols(), target=self.ident)

    def copy_into(self, *, staging: bool) -> sql.Composed:
        target = sql.Identifier(self.staging_name()) if staging else self.ident
        return sql.SQL("COPY {target} ({cols}) FROM STDIN (FORMAT BINARY)").format(target=target, cols=self._cols())

    def upsert_from_staging(self) -> sql.Composed:
        """``INSERT ... SELECT ... ON CONFLICT (keys) DO UPDATE SET`` every non-key column."""
        others = [c for c in self.columns if c not in self.keys]
        if others:
            action: sql.Composable = sql.SQL("DO UPDATE SET ") + sql.SQL(", ").join(
                sql.SQL("{c} = EXCLUDED.{c}").format(c=sql.Identifier(c)) for c in others
            )
        else:
            action = sql.SQL("DO NOTHING")
        return sql.SQL("INSERT INTO {target} ({cols}) SELECT {cols} FROM {stage} ON CONFLICT ({keys}) {action}").format(
            target=self.ident,
            cols=self._cols(),
            stage=sql.Identifier(self.staging_name()),
            keys=sql.SQL(", ").join(map(sql.Identifier, self.keys)),
            action=action,
        )

    def _cols(self) -> sql.Composable:
        return sql.SQL(", ").join(map(sql.Identifier, self.columns))


def read_columns(cur: psycopg.Cursor[tuple[object, ...]], table: TableName) -> list[ColumnInfo] | None:
    """The columns of ``table`` in order, or None when it does not exist."""
    cur.execute(
        """SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid::int, t.typcategory,
                  a.attnotnull, a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '',
                  CASE WHEN t.typtype = 'd' THEN t.typbasetype::int ELSE 0 END
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
           JOIN pg_type t ON t.oid = a.atttypid
           WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')
           ORDER BY a.attnum""",
        (table.schema, table.table),
    )
    rows = cur.fetchall()
    if not rows:
        cur.execute(
            "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s",
            (table.schema, table.table),
        )
        found = cur.fetchone()
        if found is None:
            return None
        if str(found[0]) in ("r", "p"):
            # another writer committed the table between the two statements: read it again
            return read_columns(cur, table)
        raise SchemaMismatchError(f"{table} exists but is not a table (a view or other relation); point dbtable at a table")
    return [ColumnInfo(str(r[0]), str(r[1]), int(r[2]), str(r[3]), bool(r[4]), bool(r[5]), int(r[6])) for r in rows]  # type: ignore[call-overload]


def read_primary_key(cur: psycopg.Cursor[tuple[object, ...]], table: TableName) -> list[str]:
    """The primary-key columns of ``table`` in key order ([] without a primary key)."""
    cur.execute(
        """SELECT a.attname FROM pg_index i
           JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
           CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
           JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
           WHERE n.nspname = %s AND c.relname = %s AND i.indisprimary ORDER BY k.ord""",
        (table.schema, table.table),
    )
    return [str(r[0]) for r in cur.fetchall()]


def _type_list(schema: pa.Schema, names: Sequence[str]) -> str:
    return ", ".join(f"{n} ({schema.field(n).type})" for n in names)


def _check_keys(table: TableName, keys: Sequence[str], schema: pa.Schema) -> None:
    missing = [k for k in keys if k not in schema.names]
    if missing:
        raise UpsertKeyError(
            f"upsert key column(s) {', '.join(missing)} of {table} are not in the data (columns: "
            f"{', '.join(schema.names)}); add them to the data or change upsertkey"
        )
    bad = [k for k in keys if not is_comparable(schema.field(k).type)]
    if bad:
        raise UpsertKeyError(
            f"upsert key column(s) of {table} have types that cannot be keys: {_type_list(schema, bad)}; "
            "use columns of comparable types (numbers, strings, dates, timestamps, binary)"
        )


def plan_table(
    conn: psycopg.Connection[tuple[object, ...]], table: TableName, schema: pa.Schema, upsert_key: Sequence[str] | None
) -> TablePlan:
    """Check (or create) ``table`` for data of ``schema`` and decide the upsert keys.

    Called once per sink instance before its first chunk is written (and again after a schema
    change of the data). Raises :class:`UpsertKeyError` / :class:`SchemaMismatchError` before
    anything is written. Runs in its own transaction.
    """
    bad = [p for n in schema.names if (p := identifier_problem(n, "column name"))]
    if bad:
        raise SchemaMismatchError(f"cannot write to {table}: {'; '.join(bad)} (rename it with map_batches)")
    if len(set(schema.names)) != len(schema.names):
        dup = sorted({n for n in schema.names if schema.names.count(n) > 1})
        raise SchemaMismatchError(f"the data has duplicate column names {', '.join(dup)}; rename them before writing to {table}")
    created = False
    with conn.transaction(), conn.cursor() as cur:
        columns = read_columns(cur, table)
        if columns is None:
            # Several writers (Spark tasks, concurrent queries) may find the table missing at
            # once: CREATE ... IF NOT EXISTS is not safe against that race in PostgreSQL
            # (pg_type unique violation), so creators queue on a transaction-scoped advisory
            # lock named after the table and look again once they hold it.
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"headrace-create:{table}",))
            columns = read_columns(cur, table)
        if columns is None:
            keys = list(upsert_key or [])
            _check_keys(table, keys, schema)
            defs = []
            for f in schema:
                try:
                    pg_type = arrow_to_pg(f.type)
                except TypeError as e:
                    raise SchemaMismatchError(f"cannot create {table}: column {f.name}: {e}") from None
                not_null = " NOT NULL" if f.name in keys else ""
                defs.append(sql.SQL("{} " + pg_type + not_null).format(sql.Identifier(f.name)))
            if keys:
                defs.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, keys))))
            cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(table.schema)))
            cur.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                    sql.Identifier(table.schema, table.table), sql.SQL(", ").join(defs)
                )
            )
            created = True
            columns = read_columns(cur, table)
            assert columns is not None
        pk = read_primary_key(cur, table)
    if upsert_key and set(upsert_key) != set(pk):
        what = f"its primary key is ({', '.join(pk)})" if pk else "it has no primary key"
        fix = f"set upsertkey to '{','.join(pk)}' or leave it unset" if pk else "add a primary key on those columns or leave upsertkey unset"
        raise UpsertKeyError(
            f"upsertkey ({', '.join(upsert_key)}) is not the primary key of {table}: {what}; {fix}"
        )
    keys = list(pk)
    _check_keys(table, keys, schema)
    by_name = {c.name: c for c in columns}
    unknown = [n for n in schema.names if n not in by_name]
    wrong = [n for n in schema.names if n in by_name and not fits(schema.field(n).type, by_name[n])]
    required = [c.name for c in columns if c.not_null and not c.has_default and c.name not in schema.names]
    if unknown or wrong or required:
        parts = []
        if unknown:
            parts.append(f"columns not in the table: {_type_list(schema, unknown)}")
        if wrong:
            parts.append(
                "columns whose types do not fit: "
                + ", ".join(f"{n} (data {schema.field(n).type}, table {by_name[n].type_name})" for n in wrong)
            )
        if required:
            parts.append(f"NOT NULL columns without default missing from the data: {', '.join(required)}")
        raise SchemaMismatchError(
            f"the data does not fit table {table}: {'; '.join(parts)}. Table columns: "
            + ", ".join(f"{c.name} {c.type_name}" for c in columns)
            + ". Fix: select/cast the columns with map_batches, or alter the table"
        )
    oids = tuple((by_name[n].base_oid or by_name[n].oid) for n in schema.names)
    return TablePlan(table, tuple(schema.names), oids, tuple(keys), created)

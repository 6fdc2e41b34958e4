"""Spark SQL, headrace's expression dialect, translated to DuckDB's with sqlglot.

``select_expr``, ``where``, ``with_column``, ``sql``, join conditions and pipeline SQL are
Spark SQL (Spark 4's ANSI mode) unless DuckDB's dialect is chosen with :func:`sql_dialect`
(or a pipeline's ``sqlDialect`` configuration key). A text is parsed once, when the step is
defined: a syntax error, or a function that has no DuckDB translation, is an
``ExpressionError`` then, naming it. It is translated again, once per input schema (when the
query starts), with the input's column types known, for the rules that depend on them.

What the translation changes on top of sqlglot's Spark -> DuckDB transpilation (which follows
Spark's non-ANSI mode):

- ``CAST`` and ``::`` are ANSI casts (an invalid value raises, as in Spark 4); only
  ``try_cast`` gives NULL. A cast of a fractional number or a string to an integer type
  truncates toward zero (DuckDB rounds: ``CAST(19.617 AS BIGINT)`` is 19, not 20).
- ``a / b`` raises on a zero divisor (DuckDB gives infinity, sqlglot NULL); ``%`` and ``div``
  raise too.
- The functions that return ``INT`` in Spark (``length``, ``instr``/``locate``, ``size``,
  ``year``...``second``, ...) are cast to INT (DuckDB's return BIGINT).
- ``unix_timestamp`` is whole seconds (BIGINT), of a timestamp or of a string;
  ``to_timestamp`` gives a ``TIMESTAMP`` (an instant, DuckDB's TIMESTAMPTZ) as Spark does.
- ``from_json(col, 'a INT, b STRING')`` takes Spark's DDL schema (DuckDB's JSON structure
  string still works).
- Double-quoted names are identifiers (Spark's ``spark.sql.ansi.doubleQuotedIdentifiers``);
  strings are single-quoted.

Functions sqlglot does not know pass through unchanged when DuckDB has them
(``json_extract_string``, ``epoch_ms``, ...), so DuckDB functions keep working in Spark SQL.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from types import TracebackType
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError

__all__ = [
    "DIALECTS",
    "PIPELINE_KEY",
    "SparkSql",
    "current_sql_dialect",
    "parse_spark",
    "spark_rules",
    "sql_dialect",
    "sql_dialect_name",
    "to_duckdb",
]

log = logging.getLogger(__name__)

DIALECTS = ("spark", "duckdb")
_default = "spark"
_lock = threading.Lock()
_PARSED: dict[tuple[str, str], Any] = {}  # (text, kind) -> sqlglot tree (never mutated)
_OUT: dict[Any, str] = {}  # (text, kind, schema) -> DuckDB SQL
_REMEMBER = 1024
_DUCKDB_FUNCTIONS: set[str] = set()
_TRANSLATED = {"pmod"}  # Spark functions sqlglot does not know, translated here
_WHOLE_NUMBER = "[[:space:]]*[+-]?[0-9]+[[:space:]]*"

_INT_RESULT = (
    "Length",
    "StrPosition",
    "ArraySize",
    "Year",
    "Month",
    "Day",
    "DayOfMonth",
    "DayOfWeek",
    "DayOfYear",
    "Hour",
    "Minute",
    "Second",
    "Quarter",
    "WeekOfYear",
    "Ascii",
    "Levenshtein",
)  # fmt: skip  (Spark returns INT, DuckDB BIGINT)


def sql_dialect_name(name: Any) -> str:
    """``name`` checked as a dialect (``"spark"`` or ``"duckdb"``, any case); anything else is
    a ``HeadraceError`` naming it. Called when a step or a pipeline is defined."""
    text = name.strip().lower() if isinstance(name, str) else name
    if text not in DIALECTS:
        raise HeadraceError(
            f"SQL dialect {name!r} is not one headrace knows; use 'spark' (the default) or 'duckdb'"
        )
    return str(text)


class sql_dialect:
    """Choose the dialect of the SQL in the frames defined from now on: ``"spark"`` (the
    default) or ``"duckdb"``. ``hr.sql_dialect("duckdb")`` sets it for the process; as a
    context manager (``with hr.sql_dialect("duckdb"): ...``) it sets it for the block and
    restores the previous one after. Read when a step is defined (``where``, ``select_expr``,
    ...), not when it runs; called from any thread (the setting is the process's)."""

    def __init__(self, name: str) -> None:
        global _default
        chosen = sql_dialect_name(name)
        with _lock:
            self.previous = _default
            _default = chosen
        self.name = chosen

    def __repr__(self) -> str:
        return f"sql_dialect({self.name!r})"

    def __enter__(self) -> sql_dialect:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        global _default
        with _lock:
            _default = self.previous


PIPELINE_KEY = "headrace.sql.dialect"


def current_sql_dialect() -> str:
    """The dialect steps defined now are read in: while a pipeline's definitions load or run,
    its configuration's ``headrace.sql.dialect`` if set; else ``"spark"`` unless
    :class:`sql_dialect` chose another. Called when a step is defined, on the defining thread."""
    context = sys.modules.get("headrace.pipelines._context")
    if context is not None:
        conf = context._config.get()
        if conf:
            value = {str(k).lower(): v for k, v in conf.items()}.get(PIPELINE_KEY)
            if value is not None:
                try:
                    return sql_dialect_name(value)
                except HeadraceError as e:
                    raise HeadraceError(f"pipeline configuration {PIPELINE_KEY}: {e}") from None
    return _default


def spark_rules(tree: Any) -> Any:
    """Spark's ANSI rules (the module docstring's list) applied in place to a sqlglot tree
    parsed from Spark or Databricks SQL, before it is generated as DuckDB SQL; returns the
    tree. Called when a pipeline's SQL definition or expectation is compiled."""
    return _rewrite(tree, None)


def _expression_error(message: str) -> Exception:
    from headrace.transforms.expressions import ExpressionError

    return ExpressionError(message)


def _sqlglot() -> Any:
    try:
        import sqlglot
    except ImportError:
        raise HeadraceError(
            "Spark SQL expressions need sqlglot, which is not installed; pip install 'headrace[sql]' "
            "(or choose DuckDB's dialect: hr.sql_dialect('duckdb'))"
        ) from None
    return sqlglot


_DIALECT: Any = None


def _read_dialect() -> Any:
    """Spark's dialect with double-quoted identifiers (``spark.sql.ansi.doubleQuotedIdentifiers``)."""
    global _DIALECT
    if _DIALECT is None:
        _sqlglot()
        from sqlglot.dialects.spark import Spark
        from sqlglot.tokens import TokenType

        class HeadraceSpark(Spark):
            class Tokenizer(Spark.Tokenizer):
                QUOTES = ["'"]
                IDENTIFIERS = ["`", '"']
                KEYWORDS = {**Spark.Tokenizer.KEYWORDS, "//": TokenType.DIV}  # DuckDB's `div`

        _DIALECT = HeadraceSpark
    return _DIALECT


def _first_line(e: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # sqlglot underlines the bad token for terminals
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _duckdb_functions() -> set[str]:
    if not _DUCKDB_FUNCTIONS:
        from headrace.transforms.expressions import duckdb_connection

        rows = (
            duckdb_connection().sql("SELECT DISTINCT lower(function_name) FROM duckdb_functions()").fetchall()
        )
        _DUCKDB_FUNCTIONS.update(r[0] for r in rows)
    return _DUCKDB_FUNCTIONS


def parse_spark(text: str, *, what: str, kind: str = "query") -> Any:
    """The sqlglot tree of ``text`` (``kind``: ``"query"``, one SELECT, or ``"expression"``),
    checked: a syntax error or a function with no DuckDB translation raises
    ``ExpressionError`` naming ``what``. Called when a step is defined; cached per text."""
    key = (text, kind)
    tree = _PARSED.get(key)
    if tree is not None:
        return tree
    sqlglot = _sqlglot()
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    try:
        trees = sqlglot.parse(text, read=_read_dialect()) if kind == "query" else [
            sqlglot.parse_one(text, read=_read_dialect())]  # fmt: skip
    except SqlglotError as e:
        raise _expression_error(f"{what} is not valid SQL (Spark SQL): {_first_line(e)}") from None
    trees = [t for t in trees if t is not None]
    if kind == "query":
        if len(trees) != 1:
            raise _expression_error(f"{what} must be exactly one SELECT statement; found {len(trees)}")
        if not isinstance(trees[0], exp.Query):
            raise _expression_error(
                f"{what} must be a SELECT (a query over the table `batch`); it is a {trees[0].key.upper()} statement"
            )
    elif len(trees) != 1:
        raise _expression_error(f"{what} must be one expression")
    tree = trees[0]
    _check_functions(tree, what)
    if len(_PARSED) >= _REMEMBER:
        _PARSED.clear()
    _PARSED[key] = tree
    return tree


def _check_functions(tree: Any, what: str) -> None:
    """Every function of ``tree`` has a DuckDB translation: sqlglot knows it (and generates
    DuckDB SQL for it without an "unsupported" warning), or DuckDB has a function of its name."""
    from sqlglot import exp
    from sqlglot.errors import ErrorLevel, UnsupportedError

    known = _duckdb_functions()
    for node in tree.find_all(exp.Anonymous):
        name = str(node.name).lower()
        if name not in known and name not in _TRANSLATED:
            raise _expression_error(
                f"{what}: the function {node.name}() has no translation to DuckDB (it is neither a Spark "
                f"function headrace translates nor a DuckDB function); rewrite it with other functions, "
                f"or with DuckDB's dialect (hr.sql_dialect('duckdb')) use a DuckDB function"
            )
    try:
        out = _rewrite(tree.copy(), None).sql(dialect="duckdb", unsupported_level=ErrorLevel.RAISE)
    except UnsupportedError as e:
        raise _expression_error(
            f"{what}: {_first_line(e)} (no translation of this Spark SQL to DuckDB)"
        ) from None
    import sqlglot

    try:
        back = sqlglot.parse_one(out, read="duckdb")
    except Exception:  # the DuckDB SQL is checked by DuckDB itself next
        return
    for node in back.find_all(exp.Anonymous):
        name = str(node.name).lower()
        if name not in known and not name.startswith("__hr"):
            raise _expression_error(
                f"{what}: the Spark function {node.name}() has no translation to DuckDB; rewrite it with "
                f"other functions"
            )


# Arrow -> the sqlglot type names used to annotate a step's input columns
def _sql_type(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_integer(t):
        return {8: "TINYINT", 16: "SMALLINT", 32: "INT", 64: "BIGINT"}[t.bit_width]
    if pa.types.is_float32(t):
        return "FLOAT"
    if pa.types.is_floating(t):
        return "DOUBLE"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "STRING"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "BINARY"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz else "TIMESTAMP_NTZ"
    if pa.types.is_date(t):
        return "DATE"
    return "UNKNOWN"


def _annotate(tree: Any, schema: pa.Schema) -> None:
    """Set ``.type`` on the nodes of ``tree`` from the input columns' types (in place)."""
    from sqlglot import exp
    from sqlglot.optimizer.annotate_types import annotate_types

    types = {f.name: _sql_type(f.type) for f in schema}
    for c in tree.find_all(exp.Column):
        if not c.table and c.name in types:
            c.set("table", exp.to_identifier("batch"))
    # a lone expression is typed inside SELECT <it> FROM batch (the columns need a scope)
    scope = tree if isinstance(tree, exp.Query) else exp.Select(expressions=[tree]).from_("batch", copy=False)
    try:
        annotate_types(scope, schema={"batch": types}, dialect=_read_dialect())
    except Exception as e:  # typing is a refinement: without it the untyped rules apply
        log.debug("annotating types failed: %s", e)
    if scope is not tree:
        tree.parent = None
    for c in tree.find_all(exp.Column):
        if c.table == "batch" and c.name in types:
            c.set("table", None)


def _is(node: Any, *kinds: str) -> bool:
    t = getattr(node, "type", None)
    return t is not None and any(t.is_type(k) for k in kinds)


def _name_casts(tree: Any) -> None:
    """Spark's name of an unaliased ``CAST(col AS type)`` (``col::type``, ``try_cast``) in a
    SELECT list: the column's (``selectExpr("CAST(value AS STRING)")`` gives ``value``, what the
    Kafka sink needs; ``t.c`` and a struct field ``s.f`` give their last part), not the
    expression's text. In place."""
    from sqlglot import exp

    for select in tree.find_all(exp.Select):
        for i, e in enumerate(select.expressions):
            if isinstance(e, exp.Cast) and isinstance(e.this, exp.Column) and e.this.name:
                select.expressions[i] = exp.alias_(e, exp.to_identifier(e.this.name, quoted=True))


def _rewrite(tree: Any, schema: pa.Schema | None) -> Any:
    """Spark's ANSI rules on a copy of a tree (see the module docstring)."""
    from sqlglot import exp

    _name_casts(tree)
    if schema is not None:
        _annotate(tree, schema)
    ints = exp.DataType.INTEGER_TYPES
    strings = (exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR)

    def fix(node: Any) -> Any:
        if isinstance(node, exp.TryCast) and not node.args.get("safe"):
            node = exp.Cast(**{k: v for k, v in node.args.items() if k not in ("safe", "requires_string")})
        if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.TIMESTAMP:
            # only to_timestamp(s) parses to this type (Spark's TIMESTAMP is TIMESTAMPTZ, its
            # TIMESTAMP_NTZ TIMESTAMPNTZ): Spark's to_timestamp gives an instant
            node.set("to", exp.DataType.build("TIMESTAMPTZ"))
        if isinstance(node, exp.Cast) and node.to.this in ints:
            operand = node.this
            if (isinstance(operand, exp.Literal) and not operand.is_string and "." in operand.name) \
                    or _is(operand, "DOUBLE", "FLOAT", "DECIMAL"):  # fmt: skip
                node.set("this", exp.func("trunc", operand))
            elif (isinstance(operand, exp.Literal) and operand.is_string) or _is(operand, "TEXT", "VARCHAR"):
                # Spark's ANSI cast takes whole numbers only ('19.6' raises; DuckDB rounds it to 20)
                bad: Any = exp.Null()
                if not isinstance(node, exp.TryCast):
                    bad = exp.func("error", exp.func("concat", exp.Literal.string("[CAST_INVALID_INPUT] The value '"),
                                   operand.copy(), exp.Literal.string(
                                       f"' of the type \"STRING\" cannot be cast to \"{node.to.sql('spark')}\" "
                                       "because it is malformed; use try_cast to get NULL instead")))  # fmt: skip
                whole = exp.func("regexp_full_match", operand.copy(), exp.Literal.string(_WHOLE_NUMBER))
                node.set("this", exp.Case(ifs=[exp.If(this=exp.Not(this=whole), true=bad)], default=operand))
        elif (
            isinstance(node, exp.Cast)
            and node.to.this in strings
            and _is(node.this, "TIMESTAMPTZ", "TIMESTAMPLTZ")
        ):
            # Spark writes a timestamp in the session time zone without an offset
            node.set("this", exp.Cast(this=node.this, to=exp.DataType.build("TIMESTAMPNTZ")))
        elif (
            isinstance(node, exp.Anonymous)
            and str(node.name).lower() == "pmod"
            and len(node.expressions) == 2
        ):
            a, b = node.expressions
            return exp.Mod(this=exp.Paren(this=exp.Add(this=exp.Paren(this=exp.Mod(this=a, expression=b)),
                                                       expression=b.copy())), expression=b.copy())  # fmt: skip
        elif isinstance(node, exp.JSONExtractScalar | exp.FromJson) and node.this is not None:
            # Spark gives NULL for text that is not JSON; DuckDB fails the query
            text = node.this
            node.set("this", exp.Case(ifs=[exp.If(this=exp.func("json_valid", text.copy()), true=text)]))
            schema = node.expression
            if isinstance(node, exp.FromJson) and isinstance(schema, exp.Literal) and schema.is_string:
                node.set("expression", exp.Literal.string(_json_structure(schema.name)))
        elif isinstance(node, exp.TsOrDsAdd) and not isinstance(node.parent, exp.Cast):
            return exp.Cast(this=node, to=exp.DataType.build("DATE"))  # Spark's date_add is a DATE
        elif isinstance(node, exp.Div):
            node.set("safe", None)
            divisor = node.expression
            if isinstance(divisor, exp.Literal) and not divisor.is_string and _nonzero(divisor.name):
                return node
            check = exp.Case(ifs=[exp.If(this=exp.EQ(this=divisor.copy(), expression=exp.Literal.number(0)),
                                         true=exp.func("error", exp.Literal.string(
                                             "[DIVIDE_BY_ZERO] Division by zero. Use try_divide to tolerate "
                                             "divisor being 0 and return NULL instead.")))],
                             default=divisor)  # fmt: skip
            node.set("expression", check)
        elif isinstance(node, exp.Mod):
            node.set("safe", None)
        elif isinstance(node, exp.StrToUnix):
            arg = node.this
            if arg is None:
                inner: Any = exp.func("epoch", exp.CurrentTimestamp())
            elif _is(arg, "TIMESTAMP", "TIMESTAMPTZ", "TIMESTAMPNTZ", "DATE", "TIMESTAMPLTZ"):
                inner = exp.func("epoch", arg)
            else:
                return exp.Cast(
                    this=exp.func(
                        "floor",
                        exp.func(
                            "epoch",
                            exp.Cast(
                                this=exp.StrToTime(
                                    this=arg,
                                    format=node.args.get("format") or exp.Literal.string("%Y-%m-%d %H:%M:%S"),
                                ),
                                to=exp.DataType.build("TIMESTAMPTZ"),
                            ),
                        ),
                    ),
                    to=exp.DataType.build("BIGINT"),
                )
            # whole seconds toward zero (1969-12-31 23:59:59.5 is 0, as in Spark)
            return exp.Cast(this=exp.func("trunc", inner), to=exp.DataType.build("BIGINT"))
        elif isinstance(node, exp.Floor | exp.Ceil) and not node.args.get("decimals") \
                and _is(node.this, "DOUBLE", "FLOAT") and not isinstance(node.parent, exp.Cast):  # fmt: skip
            # Spark's floor/ceil of a double is a BIGINT ((long) Math.floor(x): NaN is 0)
            x = node.this
            guarded = exp.Case(
                ifs=[exp.If(this=exp.func("isnan", x.copy()), true=exp.Literal.number(0))], default=node
            )
            return exp.Cast(this=guarded, to=exp.DataType.build("BIGINT"))
        elif isinstance(node, exp.StrToTime) and not isinstance(node.parent, exp.Cast):
            return exp.Cast(this=node, to=exp.DataType.build("TIMESTAMPTZ"))
        if type(node).__name__ in _INT_RESULT and not isinstance(node.parent, exp.Cast):
            return exp.Cast(this=node, to=exp.DataType.build("INT"))
        return node

    return tree.transform(fix, copy=False)


def _nonzero(number: str) -> bool:
    try:
        return float(number) != 0
    except ValueError:
        return False


def _json_structure(schema: str) -> str:
    """DuckDB's JSON structure for a Spark DDL schema (``'a INT, b STRING'``); a structure
    already in DuckDB's form (``'{"a": "INTEGER"}'``) is kept."""
    text = schema.strip()
    if text.startswith("{") or text.startswith("["):
        return schema
    from headrace.sql_types import ddl_to_schema

    try:
        parsed = ddl_to_schema(schema)
    except Exception as e:
        raise _expression_error(f"from_json(): the schema {schema!r} is not a DDL schema ({e}); "
                                "give one like 'a BIGINT, b STRING'") from None  # fmt: skip
    return json.dumps({f.name: _json_type(f.type) for f in parsed}, separators=(",", ":"))


def _json_type(t: pa.DataType) -> Any:
    if pa.types.is_struct(t):
        return {f.name: _json_type(f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_json_type(t.value_type)]
    if pa.types.is_timestamp(t):
        return "TIMESTAMPTZ" if t.tz else "TIMESTAMP"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    names = {pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER",
             pa.int64(): "BIGINT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR",
             pa.large_string(): "VARCHAR", pa.date32(): "DATE", pa.binary(): "BLOB"}  # fmt: skip
    if t in names:
        return names[t]
    raise _expression_error(f"from_json(): the schema's type {t} has no JSON reading; use a number, string, "
                            "boolean, date, timestamp, decimal, struct or array type")  # fmt: skip


def to_duckdb(text: str, *, what: str, schema: pa.Schema | None = None, kind: str = "query") -> str:
    """``text`` (Spark SQL: a SELECT, or one expression for ``kind="expression"``) as DuckDB
    SQL, with the rules that depend on the input columns' types applied when ``schema`` is
    given. Called when a step is defined (no schema) and once per input schema when the query
    starts; cached, so a batch never pays for it."""
    key: tuple[str, str, Any] | None = (text, kind, schema)
    try:
        out = _OUT.get(key)
    except TypeError:  # an unhashable schema
        key, out = None, None
    if out is not None:
        return out
    from sqlglot.errors import ErrorLevel, SqlglotError

    tree = parse_spark(text, what=what, kind=kind).copy()
    try:
        out = _rewrite(tree, schema).sql(dialect="duckdb", unsupported_level=ErrorLevel.RAISE)
    except SqlglotError as e:
        raise _expression_error(
            f"{what}: {_first_line(e)} (no translation of this Spark SQL to DuckDB)"
        ) from None
    if key is not None:
        if len(_OUT) >= _REMEMBER:
            _OUT.clear()
        _OUT[key] = out
    return out


class SparkSql:
    """A Spark SQL text parsed at definition; :meth:`duckdb` gives it in DuckDB's dialect."""

    def __init__(self, text: str, *, what: str, kind: str = "query") -> None:
        self.text = text
        self.what = what
        self.kind = kind
        parse_spark(text, what=what, kind=kind)

    def __repr__(self) -> str:
        return f"SparkSql({self.text!r})"

    def duckdb(self, schema: pa.Schema | None = None) -> str:
        """The DuckDB SQL for an input of ``schema`` (None: the rules that need no types).
        Called at definition and once per input schema; cached."""
        return to_duckdb(self.text, what=self.what, schema=schema, kind=self.kind)

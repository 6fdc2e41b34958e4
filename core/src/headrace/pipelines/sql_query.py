"""Compiling one SQL query of a pipeline definition into a query function.

The ``STREAM`` source becomes a headrace stream (``read_files`` -> cloudFiles, ``read_kafka``,
``read_pubsub``, ``read_kinesis`` with Databricks' argument names, or ``STREAM(dataset)``);
the query, translated to DuckDB's dialect by sqlglot, runs per micro-batch over it (the stream
visible under its alias), the other tables it reads registered as batch snapshots. A query
without ``STREAM`` (materialized views) runs once over its whole inputs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from headrace.api.static import StaticFrame
from headrace.errors import HeadraceError
from headrace.pipelines._context import active_resolver
from headrace.pipelines.elements import PipelineDefinitionError

__all__ = ["SOURCES", "compile_query", "source_options"]

SOURCES = {"read_files": "cloudFiles", "read_kafka": "kafka", "read_pubsub": "pubsub", "read_kinesis": "kinesis"}
_KAFKA_NAMES = {"bootstrapservers": "kafka.bootstrap.servers"}


def _value(node: Any, where: str) -> Any:
    from sqlglot import exp

    text = node.sql(dialect="databricks")
    sm = re.fullmatch(r"(?is)secret\(\s*'([^']*)'\s*,\s*'([^']*)'\s*\)", text.strip())
    if sm:
        var = "HEADRACE_SECRET_" + re.sub(r"\W", "_", f"{sm.group(1)}_{sm.group(2)}").upper()
        if var not in os.environ:
            raise PipelineDefinitionError(f"{where}: {text} reads the environment variable {var}, which is not set")
        return os.environ[var]
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal | exp.Neg):
        return node.to_py()
    raise PipelineDefinitionError(f"{where}: argument {text} must be a literal (string, number, true/false) or secret(...)")


def source_options(function: str, args: list[Any], where: str) -> tuple[str, dict[str, Any], str | None]:
    """(connector, options, path) of ``read_files(...)`` / ``read_kafka(...)`` / ... arguments."""
    from sqlglot import exp

    fn = function.lower()
    connector = SOURCES.get(fn)
    if connector is None:
        raise PipelineDefinitionError(f"{where}: STREAM {function}(...) is not a source; use one of {', '.join(SOURCES)}")
    path: str | None = None
    opts: dict[str, Any] = {}
    for a in args:
        if isinstance(a, exp.Kwarg | exp.PropertyEQ):
            key = a.this.name if hasattr(a.this, "name") else str(a.this)
            opts[key] = _value(a.expression, where)
        elif path is None and fn == "read_files":
            path = str(_value(a, where))
        else:
            raise PipelineDefinitionError(f"{where}: {function} takes named arguments (name => value) besides the path")
    if fn == "read_files":
        if path is None:
            raise PipelineDefinitionError(f"{where}: read_files needs a path as its first argument")
        from headrace.plugins import registry

        declared = registry().get("cloudFiles").source_options
        mapped: dict[str, Any] = {}
        for k, v in opts.items():
            if k.lower() == "format":
                mapped["cloudFiles.format"] = v
            elif declared.get(f"cloudFiles.{k}") is not None:
                mapped[f"cloudFiles.{k}"] = v
            else:
                mapped[k] = v
        opts = mapped
    elif fn == "read_kafka":
        opts = {_KAFKA_NAMES.get(k.lower(), k): v for k, v in opts.items()}
    return connector, opts, path


_REQUIRED = re.compile(r"Required keyword: '\w+' missing for <class '[\w.]*?(\w+)'>")
_INCOMPLETE = {"where": "the WHERE clause", "having": "the HAVING clause", "join": "the JOIN", "group": "GROUP BY",
               "order": "ORDER BY", "select": "the SELECT list", "paren": "the parenthesis", "cast": "the CAST"}


def _plain_description(description: str, highlight: str) -> str:
    """sqlglot's description of a parse error without its class names and token reprs."""
    near = f"{highlight!r}" if highlight else "the end of the query"
    m = _REQUIRED.fullmatch(description.strip())
    if m:
        part = _INCOMPLETE.get(m.group(1).lower())
        if part:
            return f"{part} is incomplete at {near}"
        return f"unexpected {near}: the expression before it is incomplete"
    if description.startswith("Invalid expression / Unexpected token"):
        return f"unexpected {near}"
    if description.startswith("Expecting "):
        return f"expected {description[len('Expecting '):].strip()!r} at {near}"
    description = re.sub(r"\s*but got <Token .*", "", description, flags=re.S)
    description = re.sub(r"<class '[\w.]*?(\w+)'>", r"\1", description)
    return f"{description.strip()} at {near}"


Origin = tuple[str, int, int, str]


def _syntax_error(e: Exception, query: str, where: str, origin: Origin | None) -> PipelineDefinitionError:
    """A parse error as ``file:line:column: name: SQL syntax error: plain message`` and the line
    with a caret under the column. ``origin``: the file, line and column of the query's first
    character and the text before it on that line; ``where`` (``file:line: name``) names the
    definition."""
    details = getattr(e, "errors", None) or []
    first = details[0] if details else {}
    label = where.rsplit(": ", 1)[-1] if origin else where
    if not first.get("line"):
        # a tokenizer error (an unclosed quote or comment) has no position
        at = f"{origin[0]}:{origin[1]}" if origin else where.rsplit(": ", 1)[0]
        return PipelineDefinitionError(f"{at}: {label}: SQL syntax error: the query cannot be read into tokens "
                                       "(an unclosed quote, comment or bracket?)")  # fmt: skip
    highlight = str(first.get("highlight") or "")
    line, end_col = int(first["line"]), int(first.get("col") or 1)
    col = max(1, end_col - len(highlight) + 1) if "\n" not in highlight else 1
    lines = query.splitlines() or [""]
    text = lines[min(line, len(lines)) - 1]
    message = _plain_description(str(first.get("description") or ""), highlight)
    if origin is None:
        head = f"{where}: SQL syntax error at line {line}, column {col} of the query: {message}"
    else:
        file_line = origin[1] + line - 1
        file_col = origin[2] + col - 1 if line == 1 else col
        head = f"{origin[0]}:{file_line}:{file_col}: {label}: SQL syntax error: {message}"
        text = origin[3] + text if line == 1 else text
        col = file_col
    return PipelineDefinitionError(f"{head}\n    {text.expandtabs(1)}\n    {' ' * (col - 1)}^")


def compile_query(
    query: str, *, stream: bool | None, where: str, origin: Origin | None = None
) -> Callable[[], Any]:
    """A query function for a SQL definition: it builds the stream (or batch frame) through
    the active resolver, recording its reads. ``stream`` True: exactly one STREAM source;
    None: a view (stream if it has one). ``where`` (``file:line: name``) starts every error;
    ``origin`` (file, line and column of the query's first character, the text before it on
    that line) places syntax errors. Called
    once per definition while a SQL library is registered, on the loading thread."""
    try:
        import sqlglot
        from sqlglot import exp
        from sqlglot.errors import SqlglotError
    except ImportError:
        raise HeadraceError("SQL pipeline definitions need sqlglot; pip install 'headrace[pipelines]'") from None
    try:
        tree = sqlglot.parse_one(query, read="databricks")
    except SqlglotError as e:
        raise _syntax_error(e, query, where, origin) from None
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    streams = list(tree.find_all(exp.Stream))
    if stream and len(streams) != 1:
        raise PipelineDefinitionError(
            f"{where}: a streaming table's query reads exactly one STREAM source (STREAM read_files(...) or "
            f"STREAM(table)); found {len(streams)}"
        )
    if stream is False and streams:
        raise PipelineDefinitionError(f"{where}: a materialized view reads batch inputs; remove STREAM")
    if streams and (tree.find(exp.AggFunc) is not None or tree.find(exp.Group) is not None
                    or tree.find(exp.Window) is not None or tree.find(exp.Distinct) is not None):  # fmt: skip
        raise PipelineDefinitionError(
            f"{where}: aggregations, DISTINCT and window functions over a STREAM need streaming state, which SQL "
            "streaming tables do not keep yet (each micro-batch would be aggregated alone); aggregate in a "
            "MATERIALIZED VIEW over the streaming table instead"
        )
    stream_src: tuple[str, Any] | None = None  # ("dataset", name) or ("function", (connector, opts, path))
    for s in streams:
        inner = s.this.this if isinstance(s.this, exp.Subquery) else s.this
        alias = s.this.alias if isinstance(s.this, exp.Subquery) else getattr(inner, "alias", "")
        if isinstance(inner, exp.Table) and isinstance(inner.this, exp.Anonymous):
            fn = inner.this
            stream_src = ("function", source_options(str(fn.this), list(fn.expressions), where))
            alias = alias or inner.alias or str(fn.this)
        elif isinstance(inner, exp.Table) and isinstance(inner.this, exp.Func):
            raise PipelineDefinitionError(
                f"{where}: STREAM {inner.this.sql(dialect='databricks')} is not a source; use one of {', '.join(SOURCES)}"
            )
        elif isinstance(inner, exp.Table):
            name = ".".join(p.name for p in inner.parts)
            stream_src = ("dataset", name)
            alias = alias or inner.name
        else:
            raise PipelineDefinitionError(f"{where}: STREAM({inner.sql()}) must name a table or a read_* function")
        s.replace(exp.Table(this=exp.to_identifier("batch"), alias=exp.TableAlias(this=exp.to_identifier(alias))))
    statics: list[tuple[str, str, Any]] = []  # (registered name, dataset name or None, file source)
    for t in list(tree.find_all(exp.Table)):
        if t.name == "batch" and not t.args.get("db"):
            continue
        reg_name = f"__hr_in_{len(statics)}"
        if isinstance(t.this, exp.Anonymous):
            conn, opts, path = source_options(str(t.this.this), list(t.this.expressions), where)
            if conn != "cloudFiles":
                raise PipelineDefinitionError(f"{where}: {t.this.this}(...) without STREAM is not supported; add STREAM")
            statics.append((reg_name, "", (str(opts.get("cloudFiles.format", "parquet")), path, opts)))
            alias = t.alias or str(t.this.this)
        elif isinstance(t.this, exp.Func):
            raise PipelineDefinitionError(f"{where}: {t.this.sql(dialect='databricks')} is not supported as a table; use read_files(...)")
        else:
            name = ".".join(p.name for p in t.parts)
            if name.lower() in ctes:
                continue
            statics.append((reg_name, name, None))
            alias = t.alias or t.name
        t.replace(exp.Table(this=exp.to_identifier(reg_name), alias=exp.TableAlias(this=exp.to_identifier(alias))))
    select_all = (isinstance(tree, exp.Select) and len(tree.expressions) == 1 and isinstance(tree.expressions[0], exp.Star)
                  and not statics and {k for k, v in tree.args.items() if v} <= {"expressions", "from", "from_"})  # fmt: skip
    from headrace.transforms.spark_sql import current_sql_dialect, spark_rules

    if current_sql_dialect() == "spark":  # Spark's ANSI casts, division and result types
        tree = spark_rules(tree)
    try:
        duck_sql = tree.sql(dialect="duckdb")
    except SqlglotError as e:
        raise PipelineDefinitionError(f"{where}: the query cannot be translated for DuckDB: {e}") from None
    src = stream_src

    def query_function() -> Any:
        resolver = active_resolver()
        if resolver is None:
            raise HeadraceError(f"{where}: SQL definitions run inside a pipeline")
        frames: list[tuple[str, StaticFrame]] = []
        for reg_name, name, files in statics:
            if name:
                frames.append((reg_name, resolver.static_table(name)))
            else:  # read_files(...) without STREAM: a batch read of the files (dp.read)
                from headrace.pipelines.batch_reads import read

                fmt, path, opts = files
                opts = {k.removeprefix("cloudFiles."): v for k, v in opts.items() if k.lower() != "cloudfiles.format"}
                frames.append((reg_name, read.format(fmt).options(opts).load(path)))
        if src is None:
            return StaticFrame.lazy(lambda: _run(duck_sql, None, frames), where)
        kind, what = src
        if kind == "dataset":
            import headrace as hr

            base = hr.read_stream.table(what)
        else:
            import headrace as hr

            connector, opts, path = what
            base = hr.read_stream.format(connector).options(opts).load(resolver.resolve_path(path) if path else None)
        if select_all:  # SELECT * FROM STREAM ...: the stream as it is, no SQL per batch
            return base
        return base.map_batches(lambda t: _run(duck_sql, t, frames))

    return query_function


def _run(sql: str, batch: pa.Table | None, frames: list[tuple[str, StaticFrame]]) -> pa.Table:
    """The definition's query over ``batch`` (as ``batch``) and the static frames it names,
    through the core's SQL runner (this thread's DuckDB cursor and its registrations)."""
    from headrace.transforms.expressions import run_sql

    extra = [(name, frame.to_arrow()) for name, frame in frames]
    if batch is None:  # a materialized view: no stream; `batch` names an empty placeholder
        batch = pa.table({"__no_stream": pa.array([], pa.null())})
    return run_sql(batch, sql, what=f"SQL {sql!r}", extra=extra)

"""SQL definitions (``.sql`` libraries), in Databricks' pipeline SQL::

    CREATE OR REFRESH STREAMING TABLE bronze
    AS SELECT * FROM STREAM read_files('landing', format => 'json', inferColumnTypes => true);

    CREATE OR REFRESH STREAMING TABLE silver (
      CONSTRAINT positive EXPECT (amount > 0) ON VIOLATION DROP ROW
    ) AS SELECT id, amount, k FROM STREAM(bronze);

    CREATE OR REFRESH MATERIALIZED VIEW gold
    AS SELECT s.k, d.label, sum(s.amount) AS total FROM silver s JOIN dims d USING (k) GROUP BY ALL;

    CREATE TEMPORARY VIEW v AS SELECT ...;
    CREATE STREAMING TABLE target;                                  -- for flows
    CREATE FLOW f AS INSERT INTO target BY NAME SELECT * FROM STREAM(src);

Statements are parsed with sqlglot (Databricks dialect) and run with DuckDB: a streaming
table's query once per micro-batch over the rows of its one ``STREAM`` source (``read_files``,
``read_kafka``, ``read_pubsub``, ``read_kinesis`` with Databricks' argument names, or
``STREAM(dataset)``), the other tables it joins being batch snapshots taken when the flow
starts; a materialized view's query over its whole inputs. ``${key}`` is replaced by the spec's
``configuration`` value; ``secret('scope', 'key')`` by the environment variable
``HEADRACE_SECRET_<SCOPE>_<KEY>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from headrace.pipelines.elements import (
    MATERIALIZED_VIEW,
    STREAMING_TABLE,
    TEMPORARY_VIEW,
    Dataset,
    Flow,
    GraphRegistry,
    PipelineDefinitionError,
    SourceLocation,
)
from headrace.pipelines.expectations import Expectation
from headrace.pipelines.sql_query import compile_query, source_options

__all__ = ["compile_query", "register_sql", "register_sql_file", "source_options"]

_HEADER = re.compile(
    r"^\s*CREATE\s+(?:OR\s+(?:REFRESH|REPLACE)\s+)?(?P<temp>(?:TEMPORARY|TEMP)\s+)?"
    r"(?P<kind>STREAMING\s+(?:LIVE\s+)?TABLE|MATERIALIZED\s+VIEW|LIVE\s+TABLE|LIVE\s+VIEW|VIEW|FLOW)\s+"
    r"(?:IF\s+NOT\s+EXISTS\s+)?(?P<name>`[^`]+`|[\w.]+)",
    re.IGNORECASE | re.DOTALL,
)
_INSERT = re.compile(r"^\s*INSERT\s+INTO\s+(?P<target>`[^`]+`|[\w.]+)\s+(?:BY\s+NAME\s+)?(?P<query>.*)$", re.I | re.S)
_CONSTRAINT = re.compile(
    r"^\s*CONSTRAINT\s+(?P<name>`[^`]+`|\w+)\s+EXPECT\s*\((?P<cond>.*)\)\s*"
    r"(?:ON\s+VIOLATION\s+(?P<action>DROP\s+ROW|FAIL\s+UPDATE))?\s*$",
    re.I | re.S,
)


def _split_statements(text: str) -> list[tuple[int, str]]:
    """Statements separated by ``;`` outside quotes and comments, with their first line."""
    out, buf, line, start_line = [], [], 1, 1
    i, n, quote = 0, len(text), None
    while i < n:
        c = text[i]
        if quote:
            buf.append(c)
            if c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
            buf.append(c)
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        elif text.startswith("/*", i):
            j = text.find("*/", i)
            line += text[i: (n if j < 0 else j)].count("\n")
            i = n if j < 0 else j + 2
            continue
        elif c == ";":
            if "".join(buf).strip():
                out.append((start_line, "".join(buf).strip()))
            buf = []
            start_line = line
        else:
            if not "".join(buf).strip() and not c.isspace():
                start_line = line
            buf.append(c)
        if c == "\n":
            line += 1
        i += 1
    if "".join(buf).strip():
        out.append((start_line, "".join(buf).strip()))
    return out


def _balanced(text: str, start: int) -> int:
    """Index just after the parenthesis group opening at ``text[start]``."""
    depth, quote = 0, None
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i + 1
    raise PipelineDefinitionError(f"unbalanced parentheses in {text[start:start + 80]!r}...")


def _split_top(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth, quote = 0, None
    for c in text:
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"`":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(c)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return parts


def _find_as(text: str) -> int:
    """Index of the top-level ``AS`` that starts the query, or -1."""
    depth, quote = 0, None
    for m in re.finditer(r"'|\"|`|\(|\)|\bAS\b", text, re.I):
        tok = m.group(0)
        if quote:
            if tok == quote:
                quote = None
        elif tok in ("'", '"', "`"):
            quote = tok
        elif tok == "(":
            depth += 1
        elif tok == ")":
            depth -= 1
        elif depth == 0:
            return m.start()
    return -1


def _unquote(name: str) -> str:
    return name[1:-1] if name.startswith("`") and name.endswith("`") else name


def _substitute(text: str, configuration: Mapping[str, str], where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        key = m.group(1)
        if key not in configuration:
            raise PipelineDefinitionError(f"{where}: ${{{key}}} is not in the spec's configuration")
        return configuration[key]

    return re.sub(r"\$\{([\w.\-]+)\}", sub, text)


def register_sql_file(path: str, reg: GraphRegistry, configuration: Mapping[str, str] | None = None) -> None:
    """Register every statement of a ``.sql`` library. Called once per file while loading."""
    from headrace._textfile import read_definition_file

    text = read_definition_file(path, "SQL library", error=PipelineDefinitionError)
    register_sql(text, reg, configuration or {}, filename=path)


def register_sql(text: str, reg: GraphRegistry, configuration: Mapping[str, str], *, filename: str = "<sql>") -> None:
    for line, stmt in _split_statements(text):
        loc = SourceLocation(filename, line)
        _register_statement(_substitute(stmt, configuration, str(loc)), reg, loc)


def _register_statement(stmt: str, reg: GraphRegistry, loc: SourceLocation) -> None:
    m = _HEADER.match(stmt)
    if m is None:
        raise PipelineDefinitionError(
            f"{loc}: only CREATE [OR REFRESH] STREAMING TABLE / MATERIALIZED VIEW / [TEMPORARY] VIEW / FLOW "
            f"statements define a pipeline; got {stmt[:60]!r}"
        )
    kind_word = re.sub(r"\s+", " ", m.group("kind").upper())
    name = _unquote(m.group("name"))
    rest = stmt[m.end():]
    expectations: list[Expectation] = []
    columns: list[str] = []
    body = rest.lstrip()
    if body.startswith("("):
        end = _balanced(body, 0)
        for item in _split_top(body[1:end - 1]):
            cm = _CONSTRAINT.match(item)
            if cm:
                action = (cm.group("action") or "").upper().split()
                expectations.append(Expectation(_unquote(cm.group("name")), cm.group("cond").strip(),
                                                {"DROP": "drop", "FAIL": "fail"}.get(action[0] if action else "", "warn")))  # fmt: skip
            elif item.strip():
                columns.append(item.strip())
        body = body[end:]
    as_at = _find_as(body)
    clauses, query = (body, None) if as_at < 0 else (body[:as_at], body[as_at + 2:].strip())
    comment_m = re.search(r"\bCOMMENT\s+'((?:[^']|'')*)'", clauses, re.I)
    part_m = re.search(r"\bPARTITIONED\s+BY\s*\(([^)]*)\)", clauses, re.I)
    partition_cols = [c.strip().strip("`") for c in part_m.group(1).split(",")] if part_m else None
    props_m = re.search(r"\bTBLPROPERTIES\s*\(", clauses, re.I)
    props: dict[str, str] = {}
    if props_m:
        inner = clauses[props_m.end() - 1:_balanced(clauses, props_m.end() - 1)][1:-1]
        for item in _split_top(inner):
            kv = re.match(r"\s*['\"`]?([\w.]+)['\"`]?\s*=\s*['\"]?([^'\"]*)['\"]?\s*$", item)
            if kv is None:
                raise PipelineDefinitionError(f"{loc}: TBLPROPERTIES entry {item.strip()!r} must be 'key' = 'value'")
            props[kv.group(1)] = kv.group(2)
    comment = comment_m.group(1).replace("''", "'") if comment_m else None
    if kind_word == "FLOW":
        _register_flow(name, query, reg, loc, expectations, stmt)
        return
    if "STREAMING" in kind_word:
        kind = STREAMING_TABLE
    elif kind_word in ("MATERIALIZED VIEW", "LIVE TABLE"):
        kind = MATERIALIZED_VIEW
    else:
        kind = TEMPORARY_VIEW
    reg.register_dataset(Dataset(name=name, kind=kind, comment=comment, partition_cols=partition_cols,
                                 table_properties=props, schema=", ".join(columns) or None, location=loc))  # fmt: skip
    if query is None:
        if kind != STREAMING_TABLE:
            raise PipelineDefinitionError(f"{loc}: {kind_word} {name} needs AS SELECT ...")
        return
    stream = {STREAMING_TABLE: True, MATERIALIZED_VIEW: False}.get(kind)
    func = compile_query(query, stream=stream, where=f"{loc}: {name}", origin=_origin(loc, stmt, stmt.rstrip().rfind(query)))
    reg.register_flow(Flow(name=name, target=name, func=func, kind="view" if kind == TEMPORARY_VIEW else "append",
                           location=loc, sql=stmt, expectations=tuple(expectations)))  # fmt: skip


def _origin(loc: SourceLocation, stmt: str, at: int) -> tuple[str, int, int, str] | None:
    """The file, line and column of ``stmt[at]`` and the text before it on its line (a statement
    starts at column 1 of its line), for syntax errors."""
    if at < 0 or loc.filename is None or loc.line is None:
        return None
    line_start = stmt.rfind("\n", 0, at) + 1
    return loc.filename, loc.line + stmt.count("\n", 0, at), at - line_start + 1, stmt[line_start:at]


def _register_flow(name: str, query: str | None, reg: GraphRegistry, loc: SourceLocation, exps: list[Expectation],
                   stmt: str = "") -> None:
    im = _INSERT.match(query or "")
    if im is None:
        raise PipelineDefinitionError(f"{loc}: CREATE FLOW {name} AS INSERT INTO <target> [BY NAME] SELECT ... FROM STREAM(...)")
    at = stmt.rstrip().rfind(query or "") + im.start("query")
    func = compile_query(im.group("query"), stream=True, where=f"{loc}: flow {name}", origin=_origin(loc, stmt, at))
    reg.register_flow(Flow(name=name, target=_unquote(im.group("target")), func=func, kind="append", location=loc,
                           sql=query, expectations=tuple(exps)))  # fmt: skip

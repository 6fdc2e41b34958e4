"""Data quality expectations, as Databricks pipelines have them::

    @dp.table
    @dp.expect("valid_id", "id IS NOT NULL")                 # keep the row, count it
    @dp.expect_or_drop("positive", "amount > 0")             # drop the row
    @dp.expect_or_fail("known_kind", "kind IN ('a', 'b')")   # fail the flow
    def silver(): ...

Conditions are SQL (Databricks dialect, translated by sqlglot and evaluated by DuckDB over each
micro-batch; NULL counts as a violation) or callables ``fn(pyarrow.Table) -> boolean array``.
Each flow reports, per batch, every expectation's passed and failed row counts in the event log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa

from headrace.errors import HeadraceError
from headrace.pipelines.elements import PipelineDefinitionError

__all__ = [
    "Expectation",
    "ExpectationFailed",
    "ExpectationRunner",
    "expect",
    "expect_all",
    "expect_all_or_drop",
    "expect_all_or_fail",
    "expect_or_drop",
    "expect_or_fail",
    "expectations_of",
]

F = TypeVar("F", bound=Callable[..., Any])
_ATTR = "__headrace_expectations__"
Condition = str | Callable[[pa.Table], Any]


class ExpectationFailed(HeadraceError):
    """An ``expect_or_fail`` expectation was violated: the flow stops, nothing of the batch is written."""


@dataclass(frozen=True)
class Expectation:
    """One named condition and what a violation does: ``warn``, ``drop`` or ``fail``."""

    name: str
    condition: Condition
    action: str = "warn"

    def describe(self) -> str:
        cond = self.condition if isinstance(self.condition, str) else getattr(self.condition, "__name__", "<callable>")
        return f"{self.name}: {cond} ({self.action})"

    def duckdb_sql(self) -> str:
        """The condition in DuckDB's dialect (raises PipelineDefinitionError if it does not parse)."""
        assert isinstance(self.condition, str)
        return to_duckdb(self.condition, what=f"expectation {self.name!r}")


def to_duckdb(condition: str, *, what: str) -> str:
    """A Databricks SQL expression translated to DuckDB's dialect with sqlglot."""
    try:
        import sqlglot
        from sqlglot.errors import ParseError
    except ImportError:
        raise HeadraceError("SQL in pipelines needs sqlglot; pip install 'headrace[pipelines]'") from None
    from headrace.transforms.spark_sql import current_sql_dialect, spark_rules

    try:
        trees = [t for t in sqlglot.parse(condition, read="databricks") if t is not None]
        if current_sql_dialect() == "spark":  # Spark's ANSI casts, division and result types
            trees = [spark_rules(t) for t in trees]
        exprs = [t.sql(dialect="duckdb") for t in trees]
    except ParseError as e:
        raise PipelineDefinitionError(f"{what}: {condition!r} is not a valid SQL expression: {e}") from None
    if len(exprs) != 1 or not exprs[0].strip():
        raise PipelineDefinitionError(f"{what}: {condition!r} must be exactly one SQL expression")
    return exprs[0]


def _check(name: Any, condition: Any, decorator: str) -> Expectation:
    if not isinstance(name, str) or not name:
        raise PipelineDefinitionError(f"@dp.{decorator}: the name must be a non-empty string, not {name!r}")
    if not (isinstance(condition, str) and condition.strip()) and not callable(condition):
        raise PipelineDefinitionError(
            f"@dp.{decorator}({name!r}, ...): the condition must be a SQL expression string or a callable, not {condition!r}"
        )
    return Expectation(name, condition)


def _attach(func: F, items: list[Expectation]) -> F:
    if not callable(func):
        raise PipelineDefinitionError("expectation decorators go on a query function (above or below @dp.table)")
    existing = list(getattr(func, _ATTR, []))
    taken = {e.name for e in existing}
    for e in items:
        if e.name in taken:
            raise PipelineDefinitionError(f"expectation {e.name!r} is declared twice on {func.__name__}")
        taken.add(e.name)
    setattr(func, _ATTR, [*items, *existing])
    return func


def _one(action: str, decorator: str) -> Callable[[str, Condition], Callable[[F], F]]:
    def deco(name: str, condition: Condition) -> Callable[[F], F]:
        e = _check(name, condition, decorator)
        return lambda func: _attach(func, [Expectation(e.name, e.condition, action)])

    deco.__name__ = decorator
    return deco


def _all(action: str, decorator: str) -> Callable[[Mapping[str, Condition]], Callable[[F], F]]:
    def deco(expectations: Mapping[str, Condition]) -> Callable[[F], F]:
        if not isinstance(expectations, Mapping) or not expectations:
            raise PipelineDefinitionError(f"@dp.{decorator} takes a non-empty dict of name -> condition")
        items = [Expectation(n, _check(n, c, decorator).condition, action) for n, c in expectations.items()]
        return lambda func: _attach(func, items)

    deco.__name__ = decorator
    return deco


expect = _one("warn", "expect")
expect.__doc__ = "Count the rows violating ``condition`` (kept in the table) under ``name``."
expect_or_drop = _one("drop", "expect_or_drop")
expect_or_drop.__doc__ = "Drop the rows violating ``condition``; counted under ``name``."
expect_or_fail = _one("fail", "expect_or_fail")
expect_or_fail.__doc__ = "Fail the flow (nothing of the batch is written) when a row violates ``condition``."
expect_all = _all("warn", "expect_all")
expect_all.__doc__ = "``expect`` for every ``{name: condition}`` of the dict."
expect_all_or_drop = _all("drop", "expect_all_or_drop")
expect_all_or_drop.__doc__ = "``expect_or_drop`` for every ``{name: condition}`` of the dict."
expect_all_or_fail = _all("fail", "expect_all_or_fail")
expect_all_or_fail.__doc__ = "``expect_or_fail`` for every ``{name: condition}`` of the dict."


def expectations_of(func: Any) -> list[Expectation]:
    """The expectations the decorators attached to ``func`` (top to bottom)."""
    return list(getattr(func, _ATTR, []))


class ExpectationRunner:
    """Applies a flow's expectations to each batch and counts passes and failures.

    ``apply`` runs in the engine's reading threads (thread-safe); ``take`` is called once per
    batch from the progress callback and returns the counts since the last call.
    """

    def __init__(self, dataset: str, expectations: list[Expectation]) -> None:
        self.dataset = dataset
        self.expectations = expectations
        self._sql = [e.duckdb_sql() if isinstance(e.condition, str) else None for e in expectations]
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._passed = [0] * len(self.expectations)
        self._failed = [0] * len(self.expectations)
        self._dropped = 0

    def apply(self, table: pa.Table) -> pa.Table:
        """The rows to keep; raises ExpectationFailed on an ``expect_or_fail`` violation."""
        if not self.expectations or table.num_rows == 0:
            return table
        import pyarrow.compute as pc

        masks = self._masks(table)
        keep: Any = None
        passed, failed = [], []
        for e, m in zip(self.expectations, masks, strict=True):
            ok = int(pc.sum(m).as_py() or 0)
            passed.append(ok)
            failed.append(table.num_rows - ok)
            if e.action == "fail" and ok < table.num_rows:
                bad = table.filter(pc.invert(m)).slice(0, 1).to_pylist()[0]
                shown = {k: (v if len(repr(v)) < 200 else repr(v)[:200] + "...") for k, v in bad.items()}
                with self._lock:
                    self._add(passed, failed, 0)
                raise ExpectationFailed(
                    f"expectation {e.name!r} ({e.condition if isinstance(e.condition, str) else 'callable'}) "
                    f"on {self.dataset!r} failed for {table.num_rows - ok} of {table.num_rows} rows, e.g. {shown}; "
                    "fix the input or the condition, or use @dp.expect_or_drop to drop such rows"
                )
            if e.action == "drop":
                keep = m if keep is None else pc.and_(keep, m)
        out = table if keep is None else table.filter(keep)
        with self._lock:
            self._add(passed, failed, table.num_rows - out.num_rows)
        return out

    def _add(self, passed: list[int], failed: list[int], dropped: int) -> None:
        for i, (p, f) in enumerate(zip(passed, failed, strict=False)):
            self._passed[i] += p
            self._failed[i] += f
        self._dropped += dropped

    def _masks(self, table: pa.Table) -> list[pa.ChunkedArray | pa.Array]:
        from headrace.transforms.expressions import run_sql

        out: list[Any] = [None] * len(self.expectations)
        cols = [(i, s) for i, s in enumerate(self._sql) if s is not None]
        if cols:
            select = ", ".join(f"coalesce(({s}), false) AS e{i}" for i, s in cols)
            res = run_sql(table, f"SELECT {select} FROM batch", what=f"expectations of {self.dataset!r}")
            for i, _ in cols:
                out[i] = res.column(f"e{i}")
        for i, e in enumerate(self.expectations):
            if out[i] is None:
                assert callable(e.condition)
                m = e.condition(table)
                arr = m if isinstance(m, pa.Array | pa.ChunkedArray) else pa.array(m, pa.bool_())
                if len(arr) != table.num_rows or not pa.types.is_boolean(arr.type):
                    raise HeadraceError(
                        f"expectation {e.name!r} on {self.dataset!r}: the callable must return one boolean per row "
                        f"({table.num_rows}), got {len(arr)} values of type {arr.type}"
                    )
                out[i] = arr.fill_null(False)
        return out

    def take(self) -> dict[str, Any]:
        """The data quality metrics since the last call, in the event log's shape."""
        with self._lock:
            exps = [
                {"name": e.name, "dataset": self.dataset, "action": e.action,
                 "passed_records": p, "failed_records": f}
                for e, p, f in zip(self.expectations, self._passed, self._failed, strict=True)
            ]  # fmt: skip
            out = {"dropped_records": self._dropped, "expectations": exps}
            self._reset()
        return out

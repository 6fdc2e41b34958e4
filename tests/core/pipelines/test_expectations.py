"""Expectations: SQL and callable conditions, warn/drop/fail, counts, decorator placement."""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import headrace.pipelines as dp
from headrace.errors import HeadraceError
from headrace.pipelines._context import registering
from headrace.pipelines.elements import GraphRegistry, PipelineDefinitionError
from headrace.pipelines.expectations import ExpectationFailed, ExpectationRunner, expectations_of


def _table() -> pa.Table:
    return pa.table({"id": [1, 2, 3, 4], "amount": [10, -5, None, 30], "kind": ["a", "b", "a", "z"]})


def test_warn_drop_and_counts() -> None:
    exps = [dp.expect("nonneg", "amount >= 0"), dp.expect_or_drop("known", "kind IN ('a', 'b')"),
            dp.expect_all_or_drop({"small_id": lambda t: pc.less(t["id"], 4)})]  # fmt: skip

    def f() -> None: ...

    for e in exps:
        f = e(f)
    runner = ExpectationRunner("silver", expectations_of(f))
    out = runner.apply(_table())
    assert out.column("id").to_pylist() == [1, 2, 3]  # kind z and id 4 dropped; amount NULL only counted
    m = runner.take()
    got = {e["name"]: (e["passed_records"], e["failed_records"], e["action"]) for e in m["expectations"]}
    assert got == {"nonneg": (2, 2, "warn"), "known": (3, 1, "drop"), "small_id": (3, 1, "drop")}
    assert m["dropped_records"] == 1
    assert runner.take()["dropped_records"] == 0  # counts reset per batch


def test_fail_names_the_expectation_and_a_row() -> None:
    runner = ExpectationRunner("silver", [cast(Any, dp.expect_or_fail("positive", "amount > 0")(lambda: None))
                                          .__headrace_expectations__[0]])  # fmt: skip
    with pytest.raises(ExpectationFailed, match=r"'positive' \(amount > 0\) on 'silver' failed for 2 of 4 rows, e.g. \{'id': 2"):
        runner.apply(_table())


def test_callable_must_return_one_boolean_per_row() -> None:
    runner = ExpectationRunner("t", expectations_of(dp.expect("bad", lambda t: [True])(lambda: None)))
    with pytest.raises(HeadraceError, match="one boolean per row"):
        runner.apply(_table())


def test_decorators_above_or_below_table_and_checks() -> None:
    reg = GraphRegistry()
    with registering(reg):

        @dp.expect("above", "id > 0")
        @dp.table
        @dp.expect("below", "id < 10")
        def t() -> None:
            return None

    assert [e.name for e in reg.flows["t"].all_expectations()] == ["above", "below"]
    with pytest.raises(PipelineDefinitionError, match="declared twice"):
        dp.expect("x", "a")(dp.expect("x", "b")(lambda: None))
    with pytest.raises(PipelineDefinitionError, match="SQL expression string or a callable"):
        dp.expect("x", cast(Any, 3))  # a wrong type on purpose
    with pytest.raises(PipelineDefinitionError, match="non-empty dict"):
        dp.expect_all({})


def test_outside_a_pipeline(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import headrace as hr

    monkeypatch.setenv("HEADRACE_WAREHOUSE", str(tmp_path))
    with pytest.raises(HeadraceError, match="headrace pipelines run"):
        dp.table(lambda: None)
    # outside a pipeline a name is a table of the local warehouse
    with pytest.raises(HeadraceError, match="no table 'bronze' in the warehouse"):
        hr.read_stream.table("bronze")
    with pytest.raises(HeadraceError, match="works only inside a definition"):
        dp.read.table("bronze")

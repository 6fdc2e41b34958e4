"""Spark conformance, fixed-seed tier: every catalogue query on PySpark and on headrace over the
same micro-batches, compared batch by batch (``harness.compare``).

A case with a known difference is ``xfail(strict=True)``: it passes only while the engines
differ exactly as its :class:`~tests.conformance.catalogue.Known` says (any other difference
fails it, and so does the case becoming identical: then remove the mark). The seed is in every
failure message; ``scripts/conformance.py --seeds N`` runs many.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conformance.catalogue import CATALOGUE, Case
from tests.conformance.conftest import selected_cases
from tests.conformance.generator import generate
from tests.conformance.harness import Outcome, run_many

SEED = 1
# the module's fixture runs the whole catalogue on both engines (a few minutes on 2 cores, more
# under load); it counts towards the first test's timeout
pytestmark = pytest.mark.timeout(1800)


class KnownDifference(AssertionError):
    """The engines differ exactly as the case's known difference says."""


@pytest.fixture(scope="module")
def outcomes(conformance_spark: Any, request: pytest.FixtureRequest) -> dict[str, Outcome]:
    """The selected catalogue queries (all of them, or those ``-k`` keeps) over the fixed
    seed's input, run once for the module."""
    selected = selected_cases(request)
    cases = [c for c in CATALOGUE if c.id in selected]
    data = generate(SEED)
    return {o.spec.id: o for o in run_many(conformance_spark, [c.spec for c in cases], data)}


def _param(case: Case) -> Any:
    marks = [pytest.mark.xfail(strict=True, raises=KnownDifference, reason=case.known.reason)] if case.known else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CATALOGUE])
def test_same_as_spark(case: Case, outcomes: dict[str, Outcome]) -> None:
    outcome = outcomes[case.id]
    if outcome.identical:
        return
    report = outcome.report(limit=40)
    if case.known is not None:
        unexplained = [d for d in outcome.differences if not case.known.explains(d)]
        if not unexplained:
            raise KnownDifference(f"{case.known.reason}\n{report}")
        pytest.fail(f"differences beyond the known one ({case.known.reason}):\n"
                    + "\n".join(f"  - {d}" for d in unexplained) + f"\n{report}")  # fmt: skip
    pytest.fail(f"headrace differs from Spark:\n{report}")

"""What both contract suites share: row keys, discovery, option typos, pickling, the kill runs."""

from __future__ import annotations

import importlib.metadata
import json
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pytest

from headrace.errors import OptionsError
from headrace.options import suggest
from headrace.plugins import ENTRY_POINT_GROUP, registry
from headrace.testing._kills import (
    CRASH_POINTS,
    commit_step_kills,
    connector_points,
    kill_at_point,
    measured_run,
    random_kills,
)
from headrace.testing._pipeline import PipelineResult

__all__ = ["COMMIT_STEP_KILLS", "KILLS", "SINK_KILLS", "baseline_batches", "kill_marks", "picklable", "row_keys",
           "run_kills"]  # fmt: skip

KILLS = [*CRASH_POINTS, "connector-points", "random-kills"]
# the sink suite also kills between the calls its commit makes to its client
SINK_KILLS = [*CRASH_POINTS, "connector-points", "commit-steps", "random-kills"]
COMMIT_STEP_KILLS = 4


def row_keys(table: pa.Table) -> list[str]:
    """Each row as a canonical JSON string (hashable, order-independent comparison)."""
    return [json.dumps(r, sort_keys=True, default=repr) for r in table.to_pylist()]


def _discovered(connector: str) -> None:
    spec = registry().get(connector)
    dists = {
        ep.dist.name if ep.dist is not None else "?"
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    }
    assert spec.distribution in dists, (
        f"connector {connector!r} comes from {spec.distribution!r}, not from a distribution with a "
        f"'{ENTRY_POINT_GROUP}' entry point ({sorted(dists)}); declare [project.entry-points.headrace]"
    )


def _typo_rejected(schema_names: list[str], parse: Callable[[dict[str, Any]], Any], base: dict[str, Any]) -> None:
    bogus = dict(base, noSuchOptionAnywhere="1")
    with pytest.raises(OptionsError) as e:
        parse(bogus)
    assert "noSuchOptionAnywhere" in str(e.value)
    longest = max((n for n in schema_names if len(n) >= 6 and n.lower() not in {k.lower() for k in base}), key=len, default=None)
    if longest is not None:
        typo = longest[:-1] + ("x" if longest[-1] != "x" else "y")
        if suggest(typo, schema_names) == longest:
            with pytest.raises(OptionsError) as e2:
                parse(dict(base, **{typo: "1"}))
            assert f"did you mean '{longest}'" in str(e2.value)


def _first(keys: Sequence[str], n: int = 3) -> str:
    return ", ".join(sorted(keys)[:n])


def kill_marks(fn: Callable[..., Any]) -> Callable[..., Any]:
    return pytest.mark.slow(pytest.mark.headrace_kill(fn))


def picklable(obj: Any, what: str, why: str) -> None:
    try:
        pickle.loads(pickle.dumps(obj))
    except Exception as e:
        raise AssertionError(f"{what} cannot be pickled ({type(obj).__name__}: {type(e).__name__}: {e}); {why}") from None


def run_kills(
    spec: dict[str, Any], crash: str, n_random: int, timeout: float, *, batch: int, ignore: tuple[str, ...] = ()
) -> list[PipelineResult]:
    """The kill runs of one kill test (``crash``: an engine point, ``connector-points``,
    ``commit-steps`` or ``random-kills``), from batch ``batch`` on (the first batch after the
    baseline); crash points starting with a prefix in ``ignore`` belong to the kit's own
    connectors and are not the connector's."""
    if crash == "random-kills":
        return random_kills(spec, n_random, timeout=timeout, batch=batch)
    if crash == "commit-steps":
        return commit_step_kills(spec, batch, COMMIT_STEP_KILLS, timeout=timeout)
    if crash == "connector-points":
        measured, _ = measured_run(spec, timeout=timeout, batch=batch)
        points = connector_points(measured, ignore=ignore)
        if not points:
            pytest.skip("the connector marks no crash points of its own (headrace.helpers.crash.crash_point) in the "
                        "traced run; mark one between every two steps of a commit that must happen together")  # fmt: skip
        runs = [measured]
        for k, (point, first) in enumerate(points):
            # the connector's own count (a batch id, or e.g. a segment number) one step on per kill
            at = first + 1 + k
            runs.append(kill_at_point(spec, point, at, timeout=timeout,
                                      why=f"It was passed with {first} in batch {batch} of a traced run; the run "
                                          f"after must pass it with {at}."))  # fmt: skip
        return runs
    return [kill_at_point(spec, crash, batch + 1 if crash in CRASH_POINTS else batch, timeout=timeout)]


def baseline_batches(result: PipelineResult) -> int:
    """How many batches the kill-free baseline run committed (its batch ids are 0 .. n-1): the
    kill runs go on from batch n."""
    done = [t.batch for t in result.trace if t.point == "after_commit"]
    return max(done) + 1 if done else 0

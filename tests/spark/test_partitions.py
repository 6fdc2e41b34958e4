"""How the adapter cuts a micro-batch into Spark tasks (``headraceMaxTasks``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import headrace.spark
from headrace.protocols import Partition
from headrace.spark.source import HeadraceInputPartition, group_partitions
from tests.spark._connectors import RECORD_SPEC, calls, committed
from tests.spark._util import run_available_now, values

pytestmark = pytest.mark.spark

RATE = "headrace.rate-micro-batch"


class _P(Partition):
    def __init__(self, n: int) -> None:
        self.n = n


@pytest.mark.parametrize(
    ("parts", "max_groups", "sizes"),
    [(5, 2, [3, 2]), (4, 2, [2, 2]), (3, 4, [1, 1, 1]), (4, None, [1, 1, 1, 1]), (4, 0, [1, 1, 1, 1]), (7, 3, [3, 2, 2])],
    ids=["5-into-2", "4-into-2", "fewer-than-max", "none-one-each", "zero-one-each", "7-into-3"],
)
def test_group_partitions_keeps_order_and_balances(parts: int, max_groups: int | None, sizes: list[int]) -> None:
    ps = [_P(i) for i in range(parts)]
    groups = group_partitions(ps, max_groups)
    assert [len(g) for g in groups] == sizes
    assert [p.n for g in groups for p in g] == list(range(parts))  # type: ignore[attr-defined]


@pytest.mark.parametrize(("parallelism", "tasks"), [(None, None), (1, 1), (2, 1), (3, 1), (8, 4)],
                         ids=["unknown", "one-core", "two-cores", "three-cores", "eight-cores"])  # fmt: skip
def test_default_max_tasks_is_half_the_parallelism(parallelism: int | None, tasks: int | None) -> None:
    assert headrace.spark.default_max_tasks(parallelism) == tasks


def test_input_partition_holds_one_or_many() -> None:
    one, two = _P(1), _P(2)
    assert HeadraceInputPartition(one, None, 0).partitions == (one,)
    many = HeadraceInputPartition([one, two], None, 1)
    assert many.partitions == (one, two) and many.partition is one


@pytest.mark.parametrize(("max_tasks", "tasks"), [(None, 1), ("0", 4), ("2", 2), ("3", 3)],
                         ids=["default-half-parallelism", "zero-one-per-partition", "two", "three"])
def test_micro_batch_runs_in_at_most_max_tasks(spark: Any, tmp_path: Path, max_tasks: str | None, tasks: int) -> None:
    headrace.spark.register(spark, "rate-micro-batch", RECORD_SPEC)  # local[2]: default parallelism 2, so 1 task
    opts: dict[str, Any] = {"rowsPerBatch": 12, "numPartitions": 4, "totalRows": 24,
                            "headraceStatePath": str(tmp_path / "chk" / "sources" / "0" / "headrace")}  # fmt: skip
    if max_tasks is not None:
        opts["headraceMaxTasks"] = max_tasks
    out = str(tmp_path / "out")
    run_available_now(spark, RATE, opts, "headrace.test-record", {"path": out}, str(tmp_path / "chk"))
    log = calls(out)
    assert sorted(c["batchId"] for c in log) == [0, 1]
    assert {c["messages"] for c in log} == {tasks}  # one commit message per Spark task
    assert values(committed(out)) == list(range(24))


def test_bad_max_tasks_is_an_option_error(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import AnalysisException

    headrace.spark.register(spark, "rate-micro-batch")
    with pytest.raises(AnalysisException) as e:
        (spark.readStream.format(RATE).option("headraceStatePath", str(tmp_path / "s"))
         .option("headraceMaxTasks", "two").load())  # fmt: skip
    assert "headraceMaxTasks: must be a whole number >= 0 (got 'two')" in str(e.value)

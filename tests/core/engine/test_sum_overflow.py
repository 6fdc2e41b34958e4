"""An integer sum beyond a long fails its query as Spark's default (ANSI) mode does, naming the
aggregate and the batch, before anything of that batch is committed: the sink has nothing of
it, no commit marker or state of it is written, and a restart fails the same way."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import headrace as hr
from headrace.errors import StreamingQueryException
from headrace.testing import memory_stream
from headrace.transforms.expressions import ExpressionError

TS = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("k", pa.string()), ("v", pa.int64())])
BIG = 2**62


def ts(seconds: float) -> dt.datetime:
    return dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)


@pytest.mark.parametrize("backend", ["memory", "rocksdb"])
def test_a_sum_overflow_fails_the_batch_before_anything_is_committed(tmp_path: Path, backend: str) -> None:
    name = f"ovf-{uuid.uuid4().hex[:6]}"
    stream = memory_stream(name, TS)
    chk = tmp_path / "chk"
    frame = hr.read_stream.format("memory").option("name", name).load().group_by("k").agg("count(*) AS n",
                                                                                          "sum(v) AS total")

    def run() -> hr.StreamingQuery:
        return (frame.write_stream.format("memory").query_name(name + "-out").option("checkpointLocation", str(chk))
                .option("stateStore", backend).output_mode("update").trigger(available_now=True).start())  # fmt: skip

    stream.add([{"ts": ts(0), "k": "a", "v": BIG}, {"ts": ts(1), "k": "a", "v": BIG - 1}, {"ts": ts(2), "k": "b", "v": 1}])
    assert run().await_termination(60)
    assert {r["k"]: r["total"] for r in hr.memory_table(name + "-out").to_pylist()} == {"a": 2**63 - 1, "b": 1}
    stream.add([{"ts": ts(3), "k": "a", "v": 1}, {"ts": ts(4), "k": "b", "v": 2}])
    for _ in range(2):  # the failure, then a restart: the same
        with pytest.raises(StreamingQueryException) as e:
            run().await_termination(60)
        assert e.value.batch_id == 1
        assert isinstance(e.value.cause, ExpressionError)
        msg = str(e.value)
        assert "aggregate 'sum(v) AS total' (output column 'total')" in msg and "overflowed bigint in batch 1" in msg
        assert "Traceback" not in msg
        assert sorted(p.name for p in (chk / "commits").iterdir()) == ["0"]
        changelogs = [p.name for p in (chk / "state").rglob("*") if p.parent.name == "changelog"]
        assert "0" in changelogs and not [c for c in changelogs if c.startswith("1")]
        assert hr.memory_table(name + "-out").num_rows == 2  # only batch 0's rows

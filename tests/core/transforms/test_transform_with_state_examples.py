"""The worked examples of docs/transforms.md's transform_with_state section, run as written:
each example's code block is taken from the page and run over parquet micro-batches, and its
output checked batch by batch."""

from __future__ import annotations

import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import headrace as hr

DOC = Path(__file__).resolve().parents[3] / "docs" / "transforms.md"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def example(heading: str) -> str:
    """The first python code block after ``heading`` in docs/transforms.md."""
    text = DOC.read_text()
    at = text.index(f"\n{heading}\n")
    m = re.compile(r"```python\n(.*?)```", re.S).search(text, at)
    assert m is not None, f"no python block after {heading!r}"
    return m.group(1)


def run(code: str, name: str, stream_name: str, batches: list[list[dict[str, Any]]], schema: pa.Schema,
        tmp_path: Path) -> dict[int, list[dict[str, Any]]]:  # fmt: skip
    """Run the block (which defines ``name`` from the stream ``stream_name``) over ``batches``,
    one parquet file and one micro-batch each; the rows emitted per batch id."""
    landing = tmp_path / "landing"
    landing.mkdir()
    base = time.time() - 3600
    for i, rows in enumerate(batches):
        path = landing / f"part-{i:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        os.utime(path, (base + i, base + i))  # listed in this order
    source = (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "parquet")
              .option("maxFilesPerTrigger", 1).schema(schema).load(str(landing)))  # fmt: skip
    ns: dict[str, Any] = {"hr": hr, stream_name: source}
    exec(compile(code, str(DOC), "exec"), ns)  # the page's own code
    got: dict[int, list[dict[str, Any]]] = {}

    def collect(t: pa.Table, batch_id: int) -> None:
        got.setdefault(batch_id, []).extend(t.to_pylist())

    q = (ns[name].write_stream.foreach_batch(collect).output_mode("append")
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(available_now=True).start())  # fmt: skip
    assert q.await_termination(120)
    assert q.exception() is None, q.exception()
    return {b: rows for b, rows in got.items() if rows}


def ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def test_the_sessionisation_example(tmp_path: Path) -> None:
    schema = pa.schema([("user", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])

    def at(minutes: float) -> datetime:
        return T0 + timedelta(minutes=minutes)

    batches = [
        [{"user": "ann", "ts": at(0)}, {"user": "bob", "ts": at(1)}, {"user": "ann", "ts": at(10)}],
        [{"user": "ann", "ts": at(25)}, {"user": "bob", "ts": at(50)}],  # bob: over 30 min since 1
        [{"user": "cat", "ts": at(70)}],
        [{"user": "cat", "ts": at(200)}, {"user": "ann", "ts": at(30)}],  # ann's click is late: dropped
    ]
    got = run(example("### Sessionisation"), "sessions", "clicks", batches, schema, tmp_path)
    rows = {b: sorted(tuple(r.values()) for r in rs) for b, rs in got.items()}
    assert rows == {
        # bob's click at 50 closes his first session at once
        1: [("bob", ms(at(1)), ms(at(1)), 1)],
        # cat's click at 200 closes hers; the watermark (70 - 5 minutes) passes ann's 25 + 30
        3: [("ann", ms(at(0)), ms(at(25)), 3), ("cat", ms(at(70)), ms(at(70)), 1)],
        # after the last batch the watermark is 195 minutes: a batch without data fires bob's
        4: [("bob", ms(at(50)), ms(at(50)), 1)],
    }


def test_the_fraud_rule_example(tmp_path: Path) -> None:
    schema = pa.schema([("card", pa.string()), ("country", pa.string())])
    batches = [
        [{"card": "c1", "country": c} for c in ("CZ", "DE", "AT")] + [{"card": "c2", "country": "CZ"}],
        [{"card": "c1", "country": "FR"}, {"card": "c2", "country": "CZ"}],  # c1: 4 countries
        [{"card": "c1", "country": "PL"}],  # already alerted within 10 minutes: no second alert
    ]
    got = run(example("### A fraud rule"), "alerts", "payments", batches, schema, tmp_path)
    assert list(got) == [1]
    (alert,) = got[1]
    assert alert["card"] == "c1" and alert["countries"] == 4

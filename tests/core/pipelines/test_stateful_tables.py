"""A streaming table with a watermark and a windowed aggregation (docs/pipelines.md's feature map:
"watermarks, stateful aggregations in streaming tables"): append mode emits each window once, when
the watermark passes its end, and the state survives from one pipeline run to the next."""

from __future__ import annotations

import json
import os
from typing import Any

from tests.core.pipelines.conftest import MakeProject


def _events(p: Any, name: str, seconds: list[int]) -> None:
    rows = [{"ts": f"2026-01-01T00:00:{s:02d}Z", "user": f"u{s % 2}"} for s in seconds]
    with open(p.path("events", name), "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")


def test_watermarked_window_counts_in_a_streaming_table(make_project: MakeProject) -> None:
    p = make_project(name="windows")
    p.write("transformations/defs.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.table
        def counts():
            return (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
                    .option("cloudFiles.schemaHints", "ts TIMESTAMP, user STRING")
                    .option("cloudFiles.maxFilesPerTrigger", 1).load("events")
                    .with_watermark("ts", "5 seconds")
                    .group_by(hr.window("ts", "10 seconds"), "user")
                    .agg("count(*) AS n"))
        """)
    os.makedirs(p.path("events"))
    _events(p, "1.json", [0, 1, 2, 3, 9])  # window [0, 10)
    _events(p, "2.json", [12, 13, 21])  # window [10, 20), and 21 moves the watermark to 16: [0, 10) is final
    r = p.run()
    assert r.state == "COMPLETED", r.errors
    first = sorted((row["window"]["start"].second, row["user"], row["n"]) for row in p.table("counts"))
    assert first == [(0, "u0", 2), (0, "u1", 3)]

    _events(p, "3.json", [4, 30])  # 4 is late (watermark 16): dropped; 30 moves it to 25: [10, 20) is final
    r = p.run()
    assert r.state == "COMPLETED", r.errors
    got = sorted((row["window"]["start"].second, row["user"], row["n"]) for row in p.table("counts"))
    assert got == [(0, "u0", 2), (0, "u1", 3), (10, "u0", 1), (10, "u1", 1)]

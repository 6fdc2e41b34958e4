"""A three-level pipeline project (cloudFiles -> bronze -> silver with an expectation -> gold
materialized view joining a dims table) in Python or SQL, written to a temporary folder."""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest

SPEC = """name: {name}
storage: storage
configuration:
  pipelines.trigger.interval: "0.2 seconds"
  pipelines.continuous.checkInterval: "0.2 seconds"
  folders.eu: eu
libraries:
  - glob:
      include: transformations/**
"""

PYTHON = '''
import headrace as hr
import headrace.pipelines as dp


@dp.table
def bronze():
    return (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
            .option("cloudFiles.inferColumnTypes", "true").option("cloudFiles.maxFilesPerTrigger", 2)
            .load("landing"))


@dp.table
@dp.expect_or_drop("positive", "amount > 0")
@dp.expect("small", "amount < 1000")
def silver():
    return hr.read_stream.table("bronze").map_batches(lambda t: t.select(["id", "k", "amount"]))


@dp.materialized_view
def dims():
    return dp.read.format("json").load("dims.json")


@dp.materialized_view
def gold():
    return dp.read.table("silver").join(dp.read.table("dims"), on="k").sql(
        "SELECT k, label, count(*) AS n, sum(amount) AS total FROM batch GROUP BY k, label")
'''

SQL = """
CREATE OR REFRESH STREAMING TABLE bronze
AS SELECT * FROM STREAM read_files('landing', format => 'json', inferColumnTypes => true, maxFilesPerTrigger => 2);

-- silver keeps positive amounts
CREATE OR REFRESH STREAMING TABLE silver (
  CONSTRAINT positive EXPECT (amount > 0) ON VIOLATION DROP ROW,
  CONSTRAINT small EXPECT (amount < 1000)
) AS SELECT id, k, amount FROM STREAM(bronze);

CREATE OR REFRESH MATERIALIZED VIEW dims AS SELECT * FROM read_files('dims.json', format => 'json');

CREATE OR REFRESH MATERIALIZED VIEW gold
AS SELECT s.k, d.label, count(*) AS n, sum(s.amount) AS total
FROM silver s JOIN dims d ON s.k = d.k
GROUP BY s.k, d.label;
"""

DIMS = [{"k": 0, "label": "zero"}, {"k": 1, "label": "one"}, {"k": 2, "label": "two"}]


@dataclass
class Project:
    root: str
    files_written: int = 0

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def add_files(self, n: int, rows: int = 20) -> list[dict[str, Any]]:
        """Write n landing files (atomically) of ``rows`` rows each; amounts include <= 0."""
        out = []
        for _ in range(n):
            i = self.files_written
            data = [{"id": i * 1000 + j, "k": (i + j) % 3, "amount": (i * 7 + j * 13) % 60 - 10} for j in range(rows)]
            tmp = self.path("landing", f".f{i:05d}.json")
            with open(tmp, "w") as f:
                f.write("\n".join(json.dumps(r) for r in data) + "\n")
            os.replace(tmp, self.path("landing", f"f{i:05d}.json"))
            self.files_written += 1
            out += data
        return out

    def all_rows(self) -> list[dict[str, Any]]:
        rows = []
        for name in sorted(os.listdir(self.path("landing"))):
            if name.endswith(".json") and not name.startswith("."):
                with open(self.path("landing", name)) as f:
                    rows += [json.loads(line) for line in f if line.strip()]
        return rows

    def table(self, name: str) -> list[dict[str, Any]]:
        from deltalake import DeltaTable

        return DeltaTable(self.path("storage", "tables", name)).to_pyarrow_table().to_pylist()

    def load(self) -> Any:
        from headrace.pipelines.spec import load_pipeline

        return load_pipeline(self.path("pipeline.yml"))

    def run(self, **kwargs: Any) -> Any:
        from headrace.pipelines.runner import PipelineRun

        lines: list[str] = []
        result: Any = PipelineRun(self.load(), out=lines.append, **kwargs).run()  # gets `lines` below
        result.lines = lines
        return result

    def write(self, rel: str, text: str) -> None:
        os.makedirs(os.path.dirname(self.path(rel)), exist_ok=True)
        with open(self.path(rel), "w") as f:
            f.write(textwrap.dedent(text))


def expected(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a clean run must produce, computed from the input alone."""
    silver = sorted((r["id"], r["k"], r["amount"]) for r in rows if r["amount"] > 0)
    labels = {d["k"]: d["label"] for d in DIMS}
    gold: dict[int, list[Any]] = {}
    for _, k, amount in silver:
        g = gold.setdefault(k, [labels[k], 0, 0])
        g[1] += 1
        g[2] += amount
    return {"bronze": sorted(r["id"] for r in rows), "silver": silver,
            "gold": {k: tuple(v) for k, v in gold.items()}}  # fmt: skip


def actual(p: Project) -> dict[str, Any]:
    return {
        "bronze": sorted(r["id"] for r in p.table("bronze")),
        "silver": sorted((r["id"], r["k"], r["amount"]) for r in p.table("silver")),
        "gold": {r["k"]: (r["label"], int(r["n"]), int(r["total"])) for r in p.table("gold")},
    }


class MakeProject(Protocol):
    """The ``make_project`` fixture: writes a fresh project and returns it."""

    def __call__(self, language: str = ..., name: str = ...) -> Project: ...


@pytest.fixture
def make_project(tmp_path: Path) -> MakeProject:
    def make(language: str = "python", name: str = "three_level") -> Project:
        root = str(tmp_path / name)
        p = Project(root)
        os.makedirs(p.path("landing"))
        p.write("pipeline.yml", SPEC.format(name=name))
        if language == "python":
            p.write("transformations/defs.py", PYTHON)
        else:
            p.write("transformations/defs.sql", SQL)
        with open(p.path("dims.json"), "w") as f:
            f.write("\n".join(json.dumps(d) for d in DIMS) + "\n")
        return p

    return make

"""``headrace pipelines init NAME``: a runnable example pipeline that needs no server.

JSON files in ``landing/`` -> ``bronze`` (streaming table, cloudFiles) -> ``silver``
(streaming table with an expectation) -> ``gold`` (materialized view joining the ``regions``
table), in Python, plus the same silver/gold logic as SQL for comparison.
"""

from __future__ import annotations

import json
import os

from headrace.errors import HeadraceError

__all__ = ["init_project"]

SPEC = """# headrace declarative pipeline (the shape of Spark's spark-pipeline.yml)
name: {name}
storage: storage               # a local folder (relative to this file) or s3://bucket/prefix
configuration:
  pipelines.trigger.interval: "1 second"   # continuous runs: how often each flow triggers
libraries:
  - glob:
      include: transformations/**
"""

PYTHON = '''"""Python definitions: import headrace.pipelines as dp (the pyspark.pipelines names)."""

import headrace as hr
import headrace.pipelines as dp


@dp.table(comment="raw orders, ingested once each from landing/")
def orders_bronze():
    return (
        hr.read_stream.format("cloudFiles")
        .option("cloudFiles.format", "json")
        .option("cloudFiles.inferColumnTypes", "true")
        .load("landing")
    )


@dp.table(comment="orders with a positive amount")
@dp.expect("has_region", "region IS NOT NULL")
@dp.expect_or_drop("positive_amount", "amount > 0")
def orders_silver():
    return hr.read_stream.table("orders_bronze")


@dp.materialized_view(comment="the regions dimension")
def regions():
    return dp.read.format("json").load("data/regions.json")


@dp.materialized_view(comment="revenue per region, recomputed on every run")
def revenue_by_region():
    orders = dp.read.table("orders_silver")
    return orders.join(dp.read.table("regions"), on="region").sql(
        "SELECT region, region_name, count(*) AS orders, sum(amount) AS revenue FROM batch "
        "GROUP BY region, region_name ORDER BY region"
    )
'''

SQL = """-- SQL definitions live in the same pipeline and read the Python datasets.
CREATE OR REFRESH STREAMING TABLE big_orders (
  CONSTRAINT big EXPECT (amount >= 100) ON VIOLATION DROP ROW
)
COMMENT 'orders of 100 or more'
AS SELECT id, region, amount FROM STREAM(orders_silver);

CREATE OR REFRESH MATERIALIZED VIEW big_orders_by_region
AS SELECT b.region, r.region_name, count(*) AS orders
FROM big_orders b JOIN regions r ON b.region = r.region
GROUP BY b.region, r.region_name;
"""

README = """# {name}

A headrace declarative pipeline. Run it (no server needed):

    headrace pipelines dry-run      # load and check every definition, no data read
    headrace pipelines run          # process what is in landing/
    python add_orders.py            # drop a new file in landing/
    headrace pipelines run          # only the new file is processed
    headrace pipelines graph        # the graph, with row counts (graph.svg with graphviz)
    headrace pipelines events       # the event log
    headrace pipelines run --full-refresh orders_silver
"""

ADD = '''"""Drop one more JSON file of orders into landing/ (run it, then `headrace pipelines run`)."""

import json
import os
import random

os.makedirs("landing", exist_ok=True)
n = len([f for f in os.listdir("landing") if f.endswith(".json")])
rows = [{{"id": n * 100 + i, "region": random.choice(["eu", "us", "ap"]), "amount": random.randint(-20, 300)}}
        for i in range(100)]
tmp = os.path.join("landing", f".orders-{{n:04d}}.json")
with open(tmp, "w") as f:
    f.write("\\n".join(json.dumps(r) for r in rows) + "\\n")
os.replace(tmp, os.path.join("landing", f"orders-{{n:04d}}.json"))
print(f"wrote landing/orders-{{n:04d}}.json ({{len(rows)}} orders)")
'''


def init_project(name: str, parent: str | None = None) -> str:
    """Create folder ``name`` with a runnable pipeline; returns its path."""
    if not name or os.sep in name or name in (".", ".."):
        raise HeadraceError(f"pipeline name {name!r} must be a plain folder name")
    root = os.path.join(parent or os.getcwd(), name)
    if os.path.exists(root):
        raise HeadraceError(f"{root} already exists; choose another name or remove it")
    for d in ("transformations", "landing", "data"):
        os.makedirs(os.path.join(root, d))
    files = {
        "pipeline.yml": SPEC.format(name=name),
        "transformations/orders.py": PYTHON,
        "transformations/big_orders.sql": SQL,
        "README.md": README.format(name=name),
        "add_orders.py": ADD.format(),
    }
    for rel, text in files.items():
        with open(os.path.join(root, rel), "w", encoding="utf-8") as f:
            f.write(text)
    regions = [{"region": "eu", "region_name": "Europe"}, {"region": "us", "region_name": "Americas"},
               {"region": "ap", "region_name": "Asia Pacific"}]  # fmt: skip
    with open(os.path.join(root, "data", "regions.json"), "w", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in regions) + "\n")
    orders = [{"id": i, "region": ["eu", "us", "ap", None][i % 4], "amount": (i * 37) % 250 - 20} for i in range(200)]
    with open(os.path.join(root, "landing", "orders-0000.json"), "w", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in orders) + "\n")
    return root

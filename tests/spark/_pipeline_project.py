"""A pipeline project run both by headrace and by Spark Declarative Pipelines: a streaming
table from parquet files with a SQL step and a dedup within a watermark, a streaming table of
windowed counts over it, a materialized view in Python and one in a SQL file."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["DATASETS", "write_project"]

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SCHEMA = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC")), ("user", pa.string()),
                    ("amount", pa.int64())])  # fmt: skip
DATASETS = ("events", "windows", "biggest", "totals")

SPEC = """\
name: shop
configuration:
  spark.sql.shuffle.partitions: "2"
  spark.sql.parquet.outputTimestampType: TIMESTAMP_MICROS
libraries:
  - glob:
      include: transformations/**
"""

PYTHON = """\
import headrace as hr
import headrace.pipelines as dp

SCHEMA = "id BIGINT, ts TIMESTAMP, user STRING, amount BIGINT"


@dp.table(comment="events with a positive amount, each id once")
def events():
    return (
        hr.read_stream.format("cloudFiles").option("cloudFiles.format", "parquet")
        .option("cloudFiles.maxFilesPerTrigger", "1").schema(SCHEMA).load("landing")
        .sql("SELECT id, ts, upper(user) AS user, amount FROM batch WHERE amount > 0")
        .with_watermark("ts", "10 seconds")
        .drop_duplicates_within_watermark("id")
    )


@dp.table
def windows():
    return (
        hr.read_stream.table("events").with_watermark("ts", "10 seconds")
        .group_by(hr.window("ts", "10 seconds"), "user").agg("count(*) AS n", "sum(amount) AS total")
    )


@dp.materialized_view
def biggest():
    return dp.read.table("events").sql("SELECT user, max(amount) AS top FROM batch GROUP BY user")
"""

SQL = """\
CREATE MATERIALIZED VIEW totals
AS SELECT user, count(*) AS n, sum(amount) AS total FROM events GROUP BY user;
"""


def write_project(root: Path) -> Path:
    """The project under ``root`` (spec, definitions, three parquet files of events: ids
    repeat within a file and across files, some amounts are not positive); its spec path."""
    (root / "transformations").mkdir(parents=True)
    (root / "landing").mkdir()
    (root / "pipeline.yml").write_text(SPEC)
    (root / "transformations" / "events.py").write_text(PYTHON)
    (root / "transformations" / "totals.sql").write_text(SQL)
    for part in range(3):
        rows = [(part * 20 + i - (i % 4 == 3), T0 + dt.timedelta(seconds=part * 20 + i - (i % 4 == 3)),
                 "abc"[i % 3], (i % 7) - 1) for i in range(20)]  # fmt: skip
        cols = list(zip(*rows, strict=True))
        pq.write_table(
            pa.table([list(c) for c in cols], schema=SCHEMA), root / "landing" / f"part-{part}.parquet"
        )
    return root / "pipeline.yml"

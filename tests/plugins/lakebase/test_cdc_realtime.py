"""The real-time trigger: PostgreSQL changes mirrored into another PostgreSQL table (AUTO CDC)
while the long-running batch is still open."""

# ruff: noqa: F811  (pytest fixtures imported from cdc_helpers)
from __future__ import annotations

from pathlib import Path
from typing import Any

import headrace as hr
from headrace.testing import wait_for
from tests.plugins.lakebase.cdc_helpers import Sql, cdc_name, cdc_options, lsql  # noqa: F401
from tests.services import Postgres


def test_real_time_mirror(postgres_logical: Postgres, cdc_options: dict[str, Any], cdc_name: str, lsql: Sql,
                          tmp_path: Path) -> None:  # fmt: skip
    lsql(f"CREATE TABLE {cdc_name} (id int PRIMARY KEY, n int)")
    mirror = f"{cdc_name}_m"
    q = (hr.read_stream.format("postgresql").options(cdc_options).option("pollInterval", "20 milliseconds").load()
         .write_stream.format("postgresql")
         .options(url=postgres_logical.dsn, dbtable=mirror, keys="id", sequenceBy="_lsn", batchsize=10,
                  batchinterval="20 milliseconds", applyAsDeletes="_change_type = 'delete'",
                  exceptColumnList="_change_type,_lsn,_commit_timestamp")
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(real_time="30 seconds").start())  # fmt: skip
    try:
        lsql(f"INSERT INTO {cdc_name} SELECT g, g FROM generate_series(1, 50) g")
        lsql(f"UPDATE {cdc_name} SET n = -1 WHERE id <= 5")
        lsql(f"DELETE FROM {cdc_name} WHERE id > 45")

        def mirrored() -> bool:
            if q.exception() is not None:
                raise AssertionError(str(q.exception()))
            try:
                return sorted(lsql(f"SELECT id, n FROM {mirror}")) == sorted(lsql(f"SELECT id, n FROM {cdc_name}"))
            except Exception:
                return False

        wait_for(mirrored, timeout=20, what="the mirror to catch up")
        assert q.recent_progress == [], "batch 0 ended before the mirror was checked"
    finally:
        q.stop()
    assert q.exception() is None

"""Helpers of the change-data-capture tests (importable from pipeline subprocesses)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from tests.services import Postgres

Sql = Callable[..., list[tuple[Any, ...]]]


def sql_runner(pg: Postgres) -> Sql:
    def run(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    return run


@pytest.fixture
def lsql(postgres_logical: Postgres) -> Sql:
    """``lsql(statement, params)`` on the logical-replication server, autocommit."""
    return sql_runner(postgres_logical)


@pytest.fixture
def cdc_name() -> str:
    return f"c_{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cdc_options(postgres_logical: Postgres, cdc_name: str, lsql: Sql) -> Iterator[dict[str, Any]]:
    """Source options for a fresh table ``public.<cdc_name>`` (created by the test); the slot
    and publication are dropped afterwards."""
    yield {"url": postgres_logical.dsn, "dbtable": f"public.{cdc_name}", "slotName": f"s_{cdc_name}",
           "publicationName": f"p_{cdc_name}"}  # fmt: skip
    drop_slot(lsql, f"s_{cdc_name}")


def drop_slot(lsql: Sql, slot: str) -> None:
    """Drop ``slot``, ending a backend still reading it (left by a killed pipeline)."""
    for _ in range(50):
        lsql("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = %s "
             "AND active_pid IS NOT NULL", (slot,))  # fmt: skip
        try:
            lsql("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            return
        except psycopg.errors.ObjectInUse:
            import time

            time.sleep(0.1)


def sorted_rows(table: pa.Table, key: str) -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: r[key])

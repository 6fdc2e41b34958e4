"""Fixtures of the lakebase tests: a fresh table name per test, SQL helpers on the session's
real PostgreSQL (the ``postgres`` fixture of tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.services import Postgres


@pytest.fixture
def table() -> str:
    """A table name no other test uses (the table does not exist yet)."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def pg_options(postgres: Postgres, table: str) -> dict[str, Any]:
    """Sink options for ``public.<table>`` on the test server."""
    return {"url": postgres.dsn, "dbtable": f"public.{table}"}


def _query(pg: Postgres) -> Callable[..., list[tuple[Any, ...]]]:
    def run(sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(pg.dsn, autocommit=True) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    return run


@pytest.fixture
def query(postgres: Postgres) -> Callable[..., list[tuple[Any, ...]]]:
    """``query(sql, params=None)`` -> rows (or [] for statements), in autocommit."""
    return _query(postgres)


@pytest.fixture
def durable_pg_options(postgres_durable: Postgres, table: str) -> dict[str, Any]:
    """Sink options for ``public.<table>`` on the durable server (tests that crash PostgreSQL)."""
    return {"url": postgres_durable.dsn, "dbtable": f"public.{table}"}


@pytest.fixture
def durable_query(postgres_durable: Postgres) -> Callable[..., list[tuple[Any, ...]]]:
    """``query`` on the durable server."""
    return _query(postgres_durable)

"""Shared pytest fixtures for the whole workspace."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# ---------------------------------------------------------------------------------------
# Real test servers (owned by tests/services/; logic lives there, not here).
# Session scoped and lazy: a server starts only when a test first asks for its fixture,
# on a free 127.0.0.1 port, and is stopped at the end of the session. A server that this
# machine cannot run makes its tests skip with what to install (scripts/services.sh).
# ---------------------------------------------------------------------------------------
from tests.services import S3, KafkaMock, Kinesis, Postgres, PubSubEmulator, Tansu
from tests.services.fixtures import serve

# Tests marked ``deep`` (long kill loops and paging runs over every first-party plugin, beyond
# what one representative run shows) run only with HEADRACE_DEEP=1, so the README's test
# command stays within its time budget; `HEADRACE_DEEP=1 ./scripts/test.sh` runs everything.
DEEP = os.environ.get("HEADRACE_DEEP", "") == "1"


# The contract kit kills a pipeline at each of the engine's own crash points (offsets, the
# sink's write and commit, the commit marker) one by one. Those points are the engine's, killed
# at one by one in tests/core/test_kill_restart.py, and through the kit on the built-in
# connectors (tests/core/test_contract_builtin.py) and the example plugin
# (examples/headrace-sqlite). On the first-party plugins the README's command runs the kills
# that find a connector's own bugs: random kills (weighted towards the sink's commit), the
# connector's own crash points and the kills between a commit's client calls; HEADRACE_DEEP=1
# adds every engine point for each of them, and the paging run over S3 (the local cloudFiles
# source runs the same paging code).
_KIT_KILL = "test_kill_and_restart_loses_nothing"
_KILLS_KEPT_FOR_PLUGINS = frozenset({"random-kills", "connector-points", "commit-steps"})
_DEEP_BY_NAME = frozenset({
    "tests/plugins/cloudfiles/test_contract.py::TestS3SourceContract::test_many_small_ranges_read_what_one_large_range_reads",
})  # fmt: skip


def _deep(item: pytest.Item) -> bool:
    if item.get_closest_marker("deep") is not None or item.nodeid in _DEEP_BY_NAME:
        return True
    if not item.nodeid.startswith("tests/plugins/") or not item.name.startswith(_KIT_KILL + "["):
        return False
    return item.name[len(_KIT_KILL) + 1 : -1] not in _KILLS_KEPT_FOR_PLUGINS


# scripts/test.sh runs the suite in worker processes (pytest-xdist). Each worker starts the
# servers its tests ask for on ports of its own; a module's tests stay on one worker (its
# module fixtures are set up once); and every test that runs Spark runs on one worker, in
# collection order: the conformance modules stop their own Spark sessions, which must not
# happen under tests/spark's session-wide one, and one JVM at a time fits the machine.
_SPARK_TESTS = ("tests/conformance/", "tests/spark/")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndSparkTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "spark" if module.startswith(_SPARK_TESTS) else module

    return ModulesAndSparkTogether(config, log)


def pytest_collection_modifyitems(config: Any, items: list[pytest.Item]) -> None:
    if DEEP:
        return
    drop = [item for item in items if _deep(item)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        kept = set(map(id, items)) - set(map(id, drop))
        items[:] = [item for item in items if id(item) in kept]


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    """PostgreSQL: .dsn/.url, .host, .port, .user, .password, .dbname, .restart(), .stop()."""
    yield from serve(Postgres())


@pytest.fixture(scope="session")
def postgres_durable() -> Iterator[Postgres]:
    """PostgreSQL with fsync, synchronous_commit and full_page_writes on: every acknowledged
    commit survives .crash_restart(). For tests that restart or crash it mid-stream."""
    yield from serve(Postgres(durable=True))


@pytest.fixture(scope="session")
def postgres_logical() -> Iterator[Postgres]:
    """PostgreSQL with wal_level=logical, 20 replication slots and durable commits, for the
    change data capture tests (a server of its own: they restart it and fill it with slots)."""
    from tests.services.postgres import LOGICAL_SETTINGS

    yield from serve(Postgres(settings=LOGICAL_SETTINGS))


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaMock]:
    """librdkafka mock cluster (3 brokers): .bootstrap_servers, .create_topic(name, partitions)."""
    yield from serve(KafkaMock())


@pytest.fixture(scope="session")
def tansu() -> Iterator[Tansu]:
    """Tansu broker (Admin API, transactions): .bootstrap_servers, .create_topic(name, partitions)."""
    yield from serve(Tansu())


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[PubSubEmulator]:
    """Pub/Sub emulator: .host ("127.0.0.1:PORT"), .project_id, .env(); does not set env globally."""
    yield from serve(PubSubEmulator())


@pytest.fixture(scope="session")
def kinesis() -> Iterator[Kinesis]:
    """kinesalite: .endpoint_url, .region, dummy credentials, .client()."""
    yield from serve(Kinesis())


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    """moto S3: .endpoint_url, .client(), .create_bucket(name), .delta_storage_options()."""
    yield from serve(S3())


# ------------------------------- end of test servers -----------------------------------

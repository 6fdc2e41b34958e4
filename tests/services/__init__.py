"""Real servers on 127.0.0.1 for headrace's tests and benchmarks (never mocks).

Each launcher starts its server on a free port, waits until it answers, and stops it by PID;
all share :class:`tests.services._base.Service`. Use them as context managers anywhere::

    from tests.services import Postgres
    with Postgres() as pg:
        psycopg.connect(pg.dsn)

or through the session fixtures in tests/conftest.py (``postgres``, ``kafka``, ``tansu``,
``pubsub_emulator``, ``kinesis``, ``s3``). When a server cannot be had on a machine,
``start()`` raises :class:`ServiceUnavailable` whose message says what to install (the
fixtures turn it into ``pytest.skip``); ``scripts/services.sh`` installs what pip does not.
"""

from tests.services._base import Service, ServiceStartError, ServiceUnavailable, free_port, wait_until
from tests.services.kafka import KafkaError, KafkaMock, Tansu
from tests.services.kinesis import Kinesis
from tests.services.postgres import Postgres
from tests.services.pubsub import PubSubEmulator
from tests.services.s3 import S3

__all__ = [
    "KafkaError",
    "KafkaMock",
    "Kinesis",
    "Postgres",
    "PubSubEmulator",
    "S3",
    "Service",
    "ServiceStartError",
    "ServiceUnavailable",
    "Tansu",
    "free_port",
    "wait_until",
]

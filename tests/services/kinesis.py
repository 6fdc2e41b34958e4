"""Kinesis for tests: kinesalite (npm) on 127.0.0.1, in memory.

Install: Node.js + ``npm install --prefix .tools/kinesalite kinesalite@3.3.3`` (scripts/services.sh
does it). ``kinesalite_server.js`` next to this file binds it with createStreamMs /
deleteStreamMs / updateStreamMs 0, so streams are ACTIVE at once and resharding is instant.

Faithful where moto's Kinesis is not: after SplitShard/MergeShards a closed parent shard ends
(GetRecords returns ``NextShardIterator=None``). No enhanced fan-out (SubscribeToShard,
RegisterStreamConsumer), no ListStreamConsumers, no UpdateShardCount, no stream ARNs on input.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.services._aws import AwsEndpoint
from tests.services._base import REPO_ROOT, Service, ServiceUnavailable, http_get

KINESALITE_VERSION = "3.3.3"
KINESALITE_DIR = REPO_ROOT / ".tools" / "kinesalite" / "node_modules" / "kinesalite"
SERVER_JS = Path(__file__).with_name("kinesalite_server.js")


class Kinesis(AwsEndpoint, Service):
    """kinesalite; use ``endpoint_url``, ``region``, the dummy credentials, or :meth:`client`."""

    name = "kinesalite"
    endpoint_env = "AWS_ENDPOINT_URL_KINESIS"

    def __init__(self, *, port: int | None = None, startup_timeout: float = 30.0) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.node = shutil.which("node")

    def check_available(self) -> None:
        if self.node is None:
            raise ServiceUnavailable(
                "node not found (kinesalite needs Node.js): `apt-get install nodejs npm`, then `bash scripts/services.sh`"
            )
        if not (KINESALITE_DIR / "package.json").exists():
            raise ServiceUnavailable(
                f"kinesalite not installed: `npm install --prefix .tools/kinesalite kinesalite@{KINESALITE_VERSION}` "
                "(or `bash scripts/services.sh`)"
            )

    def command(self) -> Sequence[str]:
        return [str(self.node), str(SERVER_JS), str(self.port), str(KINESALITE_DIR)]

    def is_ready(self) -> bool:
        # kinesalite answers any GET with an error document: an answer at all means ready.
        return http_get(self.endpoint_url) is not None

    def client(self, **kwargs: Any) -> Any:
        """A boto3 Kinesis client for this server."""
        import boto3
        from botocore.config import Config

        config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30)
        return boto3.client("kinesis", config=config, **{**self.credentials(), **kwargs})

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("NODE_ENV", "production")
        return env

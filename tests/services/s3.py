"""S3 for tests: moto's standalone server (``pip install "moto[server]"``) on 127.0.0.1.

One moto server process keeps all buckets in memory; ``reset()`` empties it between tests
that need a clean slate. Verified: ListObjectsV2 with StartAfter and pagination, conditional
put (``IfNoneMatch="*"`` -> 412 PreconditionFailed), ETag / LastModified.

delta-rs (``deltalake``) works against it with :meth:`S3.delta_storage_options` (the bucket
must exist first: :meth:`S3.create_bucket`). deltalake >= 1.0 commits with S3 conditional
put (``If-None-Match``), which moto implements, so neither ``AWS_S3_ALLOW_UNSAFE_RENAME`` nor
a DynamoDB locking provider is needed, and concurrent appenders do not lose commits (checked
by tests/services_selftest). ``AWS_S3_ALLOW_UNSAFE_RENAME=true`` would only matter for old
deltalake versions without conditional-put support.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.util import find_spec
from typing import Any

from tests.services._aws import AwsEndpoint
from tests.services._base import Service, ServiceUnavailable, http_get


class S3(AwsEndpoint, Service):
    """moto server; use ``endpoint_url``, ``region``, the dummy credentials, or :meth:`client`."""

    name = "moto-s3"

    def check_available(self) -> None:
        if find_spec("moto") is None or find_spec("flask") is None:
            raise ServiceUnavailable(
                'moto server not installed: `pip install "moto[server]"` (requirements-dev.txt)'
            )

    def command(self) -> Sequence[str]:
        return [sys.executable, "-m", "moto.server", "-H", self.bind_host, "-p", str(self.port)]

    def is_ready(self) -> bool:
        got = http_get(f"{self.endpoint_url}/moto-api/")
        return got is not None and got[0] == 200

    def client(self, service: str = "s3", **kwargs: Any) -> Any:
        """A boto3 client (S3 by default, path-style addressing) for this server."""
        import boto3
        from botocore.config import Config

        config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2, "mode": "standard"})
        return boto3.client(service, config=config, **{**self.credentials(), **kwargs})

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (no error if it exists); returns ``name``."""
        s3 = self.client()
        try:
            s3.create_bucket(Bucket=name)
        except s3.exceptions.BucketAlreadyOwnedByYou:
            pass
        return name

    def delta_storage_options(self, **extra: str) -> dict[str, str]:
        """``storage_options`` for deltalake (delta-rs) reading/writing ``s3://bucket/path``."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": self.aws_access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.aws_secret_access_key,
            "AWS_REGION": self.region,
            **extra,
        }

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset API)."""
        import urllib.request

        req = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

"""Building a boto3 Kinesis client from validated options (credentials never logged)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import botocore.session
from botocore.config import Config
from botocore.credentials import RefreshableCredentials
from botocore.exceptions import ClientError, ConnectionError, EndpointConnectionError, ReadTimeoutError

from headrace.errors import HeadraceError
from headrace.helpers.retry import backoff
from headrace.options import Options
from headrace_kinesis._options import (  # typed option handles
    AWS_ACCESS_KEY,
    AWS_SECRET_KEY,
    AWS_SESSION_TOKEN,
    ENDPOINT,
    REGION,
    ROLE_ARN,
    ROLE_EXTERNAL_ID,
    ROLE_SESSION_NAME,
    STREAM_ARN,
    STREAM_NAME,
    STS_ENDPOINT,
)

__all__ = ["RETRYABLE_CODES", "StreamRef", "error_code", "make_client", "stream_ref", "with_backoff"]

T = TypeVar("T")

RETRYABLE_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "LimitExceededException", "ThrottlingException",
     "KMSThrottlingException", "InternalFailure", "ServiceUnavailable", "InternalServerError"}
)  # fmt: skip


@dataclass(frozen=True)
class StreamRef:
    """Which stream, in which region: from streamName or streamARN."""

    name: str
    region: str | None
    arn: str | None = None

    def __str__(self) -> str:
        return self.arn or self.name


def stream_ref(options: Options) -> StreamRef:
    """The stream the options name. ``streamARN`` gives the name and (unless ``region``) the region."""
    region = options[REGION]
    arn = options[STREAM_ARN]
    if arn:
        parts = arn.split(":")
        return StreamRef(parts[5].split("/", 1)[1], region or parts[3], arn)
    return StreamRef(options[STREAM_NAME] or "", region)  # a rule makes one of streamName / streamARN set


def _session(options: Options, region: str | None) -> boto3.Session:
    key, secret = options.reveal(AWS_ACCESS_KEY), options.reveal(AWS_SECRET_KEY)
    base = boto3.Session(
        aws_access_key_id=key, aws_secret_access_key=secret,
        aws_session_token=options.reveal(AWS_SESSION_TOKEN), region_name=region,
    )  # fmt: skip
    role = options[ROLE_ARN]
    if not role:
        return base
    sts = base.client("sts", endpoint_url=options[STS_ENDPOINT], region_name=region or base.region_name or "us-east-1")
    kwargs: dict[str, Any] = {"RoleArn": role, "RoleSessionName": options[ROLE_SESSION_NAME]}
    if options[ROLE_EXTERNAL_ID]:
        kwargs["ExternalId"] = options.reveal(ROLE_EXTERNAL_ID)

    def refresh() -> dict[str, str]:
        try:
            c = sts.assume_role(**kwargs)["Credentials"]
        except ClientError as e:
            raise HeadraceError(
                f"kinesis: cannot assume role {role} ({error_code(e)}: {e.response.get('Error', {}).get('Message', '')}); "
                "fix: check roleArn / roleExternalId and that the base credentials may call sts:AssumeRole"
            ) from None
        return {"access_key": c["AccessKeyId"], "secret_key": c["SecretAccessKey"], "token": c["SessionToken"],
                "expiry_time": c["Expiration"].isoformat()}  # fmt: skip

    creds = RefreshableCredentials.create_from_metadata(metadata=refresh(), refresh_using=refresh, method="sts-assume-role")
    core = botocore.session.get_session()
    core._credentials = creds  # the documented way to plug refreshable credentials into a session
    return boto3.Session(botocore_session=core, region_name=region)


_CLIENTS: dict[tuple[Any, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()
_CONNECTION_OPTIONS = ("streamName", "streamARN", "region", "endpoint", "awsAccessKey", "awsSecretKey", "awsSessionToken",
                       "roleArn", "roleExternalId", "roleSessionName", "stsEndpoint")  # fmt: skip


def make_client(options: Options, *, read_timeout: float = 60.0) -> Any:
    """A Kinesis client for the options' stream, region, endpoint and credentials.

    Clients are thread-safe and cost ~0.4 s to build, so one is shared per process for equal
    connection options. botocore's own retries are limited (2 attempts); throttling is retried
    by :func:`with_backoff`.
    """
    key = (read_timeout, *(options.reveal(n) for n in _CONNECTION_OPTIONS))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = _new_client(options, read_timeout)
        return client


def _new_client(options: Options, read_timeout: float) -> Any:
    ref = stream_ref(options)
    session = _session(options, ref.region)
    region = ref.region or session.region_name
    if region is None and not options[ENDPOINT]:
        raise HeadraceError(
            f"kinesis: no AWS region for stream {ref}; fix: set the region option, use streamARN, or set AWS_REGION"
        )
    config = Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=10, read_timeout=read_timeout,
                    max_pool_connections=32)  # fmt: skip
    return session.client("kinesis", region_name=region or "us-east-1", endpoint_url=options[ENDPOINT], config=config)


def error_code(e: BaseException) -> str:
    """The AWS error code of a botocore ClientError ('' for other exceptions)."""
    if isinstance(e, ClientError):
        return str(e.response.get("Error", {}).get("Code", ""))
    return ""


def with_backoff(
    fn: Callable[[], T],
    *,
    what: str,
    attempts: int = 12,
    base: float = 0.1,
    cap: float = 5.0,
    on_retry: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn``; on throttling (ProvisionedThroughputExceeded, LimitExceeded, ...) or a
    dropped connection, retry with exponential backoff and full jitter, ``attempts`` times in all.

    Other errors propagate at once. ``what`` names the call in the final error.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except ClientError as e:
            code = error_code(e)
            if code not in RETRYABLE_CODES or attempt == attempts - 1:
                if code in RETRYABLE_CODES:
                    raise HeadraceError(
                        f"kinesis: {what} still throttled ({code}) after {attempts} attempts; fix: lower the read/write "
                        "rate (maxFetchRate, minFetchPeriod, maxRecordsPerRequest) or add shards"
                    ) from e
                raise
            if on_retry is not None:
                on_retry(code)
        except (EndpointConnectionError, ConnectionError, ReadTimeoutError):
            if attempt == attempts - 1:
                raise
            if on_retry is not None:
                on_retry("connection")
        sleep(backoff(attempt + 1, base=base, cap=cap))
    raise AssertionError("unreachable")

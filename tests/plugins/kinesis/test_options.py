"""Option declarations of the kinesis connector: rules, unsupported options, lazy loading, secrets."""

from __future__ import annotations

import subprocess
import sys

import pytest

from headrace.errors import OptionsError
from headrace_kinesis._options import SINK_OPTIONS, SOURCE_OPTIONS

BASE = {"streamName": "s", "region": "us-east-1"}


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        pytest.param({"region": "us-east-1"}, r"exactly one of streamName, streamARN \(none", id="no-stream"),
        pytest.param({**BASE, "streamARN": "arn:aws:kinesis:us-east-1:123456789012:stream/s"}, r"are all set", id="both-streams"),
        pytest.param({**BASE, "consumerMode": "efo"}, r"'efo' .* not implemented", id="efo"),
        pytest.param({**BASE, "consumerName": "c"}, r"not supported by headrace: enhanced fan-out", id="consumerName"),
        pytest.param({**BASE, "serviceCredential": "x"}, r"Unity Catalog", id="serviceCredential"),
        pytest.param({**BASE, "initialPosition": "at_timestamp"}, r"needs initialTimestamp", id="at_timestamp-without-ts"),
        pytest.param({**BASE, "initialTimestamp": "2024-01-01"}, r"only applies with initialPosition=at_timestamp", id="ts-without-at"),
        pytest.param({**BASE, "initialPosition": "lates"}, r"did you mean 'latest'", id="typo-position"),
        pytest.param({**BASE, "maxRecordsPerFetch": 10001}, r"more than the maximum 10000", id="too-many-per-fetch"),
        pytest.param({**BASE, "awsAccessKey": "AKIA"}, r"go together", id="key-without-secret"),
        pytest.param({**BASE, "roleExternalId": "x"}, r"roleExternalId: needs roleArn", id="external-id-without-role"),
        pytest.param({**BASE, "streamname": "x"}, r"given twice", id="case-duplicate"),
    ],
)
def test_source_option_errors(raw: dict[str, object], match: str) -> None:
    with pytest.raises(OptionsError, match=match):
        SOURCE_OPTIONS.parse(raw, connector="kinesis", role="source")


def test_defaults_and_case_insensitive_names() -> None:
    o = SOURCE_OPTIONS.parse({"STREAMNAME": "s", "minfetchperiod": "1s", "initialposition": "TRIM_HORIZON"})
    assert o["streamName"] == "s" and o["minFetchPeriod"] == 1.0 and o["initialPosition"] == "trim_horizon"
    assert o["maxRecordsPerFetch"] == 10000 and o["maxFetchRate"] == 1.0 and o["failOnDataLoss"] is True
    assert o["maxFetchDuration"] == 10.0 and o["shardFetchInterval"] == 1.0 and o["consumerMode"] == "polling"


def test_arn_gives_name_and_region() -> None:
    from headrace_kinesis._client import stream_ref

    o = SOURCE_OPTIONS.parse({"streamARN": "arn:aws:kinesis:eu-west-2:123456789012:stream/orders"})
    ref = stream_ref(o)
    assert (ref.name, ref.region) == ("orders", "eu-west-2")


def test_secrets_never_shown() -> None:
    o = SINK_OPTIONS.parse({**BASE, "awsAccessKey": "AKIAVISIBLE", "awsSecretKey": "s3cr3t-value"})
    assert "s3cr3t" not in repr(o) and "AKIAVISIBLE" not in repr(o)
    with pytest.raises(OptionsError) as e:
        SINK_OPTIONS.parse({**BASE, "awsSecretKey": "s3cr3t-value"})
    assert "s3cr3t" not in str(e.value)


def test_sink_limits() -> None:
    with pytest.raises(OptionsError, match=r"more than the maximum 500"):
        SINK_OPTIONS.parse({**BASE, "maxRecordsPerRequest": 501})


def test_plugin_does_not_import_boto3() -> None:
    code = ("import sys, headrace_kinesis._plugin as p; specs = p.headrace_connectors(); "
            "assert specs[0].requires == ('boto3',); assert 'boto3' not in sys.modules and 'botocore' not in sys.modules")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)

"""Option declarations of the pubsub connector: parsing, defaults, rules, secrets. No I/O."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from headrace.errors import OptionsError
from headrace.plugins import registry
from headrace_pubsub._options import SINK_OPTIONS, SOURCE_OPTIONS

BASE = {"projectId": "my-project", "topicId": "my-topic", "subscriptionId": "my-sub"}
SINK_BASE = {"projectId": "my-project", "topicId": "my-topic"}
KEY = {"clientEmail": "sa@p.iam.gserviceaccount.com", "clientId": "123", "privateKey": "-----BEGIN PRIVATE KEY-----x",
       "privateKeyId": "abc"}  # fmt: skip


def parse(raw: dict[str, Any]) -> Any:
    return SOURCE_OPTIONS.parse(raw, connector="pubsub", role="source")


def test_defaults_match_the_reference() -> None:
    o = parse(BASE)
    assert o["maxRecordsPerFetch"] == 1000
    assert o["maxFetchPeriod"] == 10.0  # "10 seconds", parsed
    assert o["deleteSubscriptionOnStreamStop"] is False
    assert o["maxBytesPerTrigger"] is None
    assert o["numFetchPartitions"] == 1


def test_names_match_case_insensitively_and_values_are_coerced() -> None:
    o = parse({"SUBSCRIPTIONID": "my-sub", "projectid": "my-project", "TopicId": "my-topic",
               "maxrecordsperfetch": "50", "maxFetchPeriod": "2s", "maxBytesPerTrigger": "1m",
               "deleteSubscriptionOnStreamStop": "true", "numFetchPartitions": 3})  # fmt: skip
    assert (o["maxRecordsPerFetch"], o["maxFetchPeriod"], o["maxBytesPerTrigger"]) == (50, 2.0, 1 << 20)
    assert o["deleteSubscriptionOnStreamStop"] is True and o["numFetchPartitions"] == 3


@pytest.mark.parametrize("missing", ["subscriptionId", "topicId", "projectId"])
def test_required_options(missing: str) -> None:
    with pytest.raises(OptionsError, match=f"{missing}: is required"):
        parse({k: v for k, v in BASE.items() if k != missing})


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("maxRecordsPerFetch", "0", "less than the minimum 1"),
        ("maxFetchPeriod", "soon", "is not a duration"),
        ("maxBytesPerTrigger", "lots", "is not a size"),
        ("numFetchPartitions", "many", "is not an integer"),
        ("topicId", "t", "is not valid: a Pub/Sub id"),
        ("subscriptionId", "9starts-with-digit", "is not valid"),
        ("ackDeadlineSeconds", "601", "more than the maximum 600"),
    ],
    ids=["records-zero", "period-word", "bytes-word", "partitions-word", "topic-too-short", "sub-digit", "deadline-big"],
)
def test_invalid_values_name_option_and_value(option: str, value: str, message: str) -> None:
    with pytest.raises(OptionsError) as e:
        parse({**BASE, option: value})
    assert option in str(e.value) and message in str(e.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(OptionsError) as e:
        parse({"topicId": "my-topic", "maxRecordsPerFetch": "-1", "maxFetchPerid": "1s"})
    text = str(e.value)
    assert "subscriptionId: is required" in text and "projectId: is required" in text
    assert "maxRecordsPerFetch" in text and "did you mean 'maxFetchPeriod'" in text


def test_service_account_options_go_together_and_stay_secret() -> None:
    o = parse({**BASE, **KEY})
    assert "BEGIN" not in repr(o) and "sa@p" not in repr(o)
    assert o.reveal("privateKey").startswith("-----BEGIN")
    with pytest.raises(OptionsError) as e:
        parse({**BASE, "clientEmail": "sa@p.iam.gserviceaccount.com", "privateKey": "-----BEGIN secret"})
    assert "go together" in str(e.value) and "secret" not in str(e.value).replace("(secret)", "")


def test_credentials_file_excludes_inline_key() -> None:
    with pytest.raises(OptionsError, match="cannot be used together"):
        parse({**BASE, **KEY, "credentialsFile": "/k.json"})


def test_databricks_service_credential_is_rejected_with_reason() -> None:
    with pytest.raises(OptionsError, match="serviceCredential: not supported by headrace: Databricks Unity Catalog"):
        parse({**BASE, "serviceCredential": "my-cred"})


def test_sink_options() -> None:
    o = SINK_OPTIONS.parse({**SINK_BASE, "batchMaxMessages": "500", "batchMaxLatency": "5ms"}, connector="pubsub", role="sink")
    assert (o["batchMaxMessages"], o["batchMaxLatency"], o["batchMaxBytes"]) == (500, 0.005, 1 << 20)
    assert o["enableMessageOrdering"] is None
    with pytest.raises(OptionsError, match="subscriptionId: unknown option"):
        SINK_OPTIONS.parse({**SINK_BASE, "subscriptionId": "my-sub"}, connector="pubsub", role="sink")
    with pytest.raises(OptionsError, match="more than the maximum 1000"):
        SINK_OPTIONS.parse({**SINK_BASE, "batchMaxMessages": 5000}, connector="pubsub", role="sink")


def test_plugin_loading_does_not_import_the_client_library() -> None:
    import subprocess

    code = ("import sys; from headrace.plugins import registry; spec = registry().get('pubsub'); "
            "assert spec.source_options.get('subscriptionid') is not None; "
            "print('google.cloud.pubsub_v1' in sys.modules, 'grpc' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


def test_describe_lists_every_option() -> None:
    spec = registry().get("pubsub")
    text = spec.source_options.render("source")
    for name in ("subscriptionId", "maxRecordsPerFetch", "maxFetchPeriod", "numFetchPartitions",
                 "deleteSubscriptionOnStreamStop", "maxBytesPerTrigger", "privateKey", "serviceCredential"):  # fmt: skip
        assert name in text
    assert spec.requires == ("google.cloud.pubsub_v1",)

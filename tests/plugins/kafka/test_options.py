"""Option validation of the kafka source and sink: every problem at once, before any I/O."""

from __future__ import annotations

from typing import Any

import pytest

from headrace.errors import OptionsError
from headrace.plugins import registry
from headrace_kafka._options import SINK_OPTIONS, SOURCE_OPTIONS

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9"}


def src(**kw: Any) -> Any:
    return SOURCE_OPTIONS.parse({**BASE, **kw}, connector="kafka", role="source")


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        pytest.param({}, "set exactly one of subscribe, subscribePattern, assign (none", id="no-subscription"),
        pytest.param({"subscribe": "a", "assign": '{"a": [0]}'}, "subscribe, assign are all set", id="two-subscriptions"),
        pytest.param({"subscribe": "a", "startingOffsets": '{"a": {"0": -3}}'}, "-3 is not valid", id="offset-below-minus-2"),
        pytest.param({"subscribe": "a", "startingOffsets": "{bad"}, "startingOffsets", id="bad-json"),
        pytest.param({"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, "-2 is not valid", id="ending-earliest-json"),
        pytest.param({"subscribe": "a", "endingOffsets": "earliest"}, "'earliest' is not allowed", id="ending-earliest"),
        pytest.param({"assign": '{"a": "0"}'}, "not a JSON object of topics to partition lists", id="bad-assign"),
        pytest.param({"subscribe": "a", "kafka.auto.offset.reset": "earliest"}, "use startingOffsets", id="auto-offset-reset"),
        pytest.param({"subscribe": "a", "kafka.sasl.jaas.config": "x"}, "kafka.sasl.username", id="jaas"),
        pytest.param({"subscribe": "a", "serviceCredential": "x"}, "not supported by headrace", id="databricks-only"),
        pytest.param({"subscribe": "a", "minOffsetsPerTrigger": 10, "maxOffsetsPerTrigger": 5}, "more than maxOffsetsPerTrigger",
                     id="min-above-max"),
        pytest.param({"subscribe": "a", "maxOffsetsPerTriger": 5}, "did you mean 'maxOffsetsPerTrigger'", id="typo"),
    ],
)
def test_source_option_errors(given: dict[str, Any], needle: str) -> None:
    with pytest.raises(OptionsError) as e:
        src(**given)
    assert needle in str(e.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(OptionsError) as e:
        SOURCE_OPTIONS.parse({"subscribe": "a", "maxOffsetsPerTrigger": "x", "failOnDataLoss": "maybe"}, connector="kafka")
    text = str(e.value)
    assert "kafka.bootstrap.servers" in text and "maxOffsetsPerTrigger" in text and "failOnDataLoss" in text


def test_names_are_case_insensitive_and_typed() -> None:
    o = src(SUBSCRIBE="a,b", maxoffsetspertrigger="100", FAILONDATALOSS="false", maxTriggerDelay="30s",
            startingOffsets='{"a": {"0": -2}}')  # fmt: skip
    assert o["subscribe"] == ["a", "b"] and o["maxOffsetsPerTrigger"] == 100 and o["failOnDataLoss"] is False
    assert o["maxTriggerDelay"] == 30.0 and o["startingOffsets"] == {"a": {"0": -2}}
    assert src(subscribe="a")["startingOffsets"] == "latest"


def test_secrets_are_redacted_but_passed_to_the_client() -> None:
    from headrace_kafka._client import consumer_config

    o = src(subscribe="a", **{"kafka.sasl.password": "hunter2", "kafka.security.protocol": "SASL_SSL"})
    assert "hunter2" not in repr(o) and "hunter2" not in str(o.redacted())
    conf = consumer_config(o, "g")
    assert conf["sasl.password"] == "hunter2" and conf["security.protocol"] == "SASL_SSL"
    with pytest.raises(OptionsError) as e:
        src(subscribe="a", **{"kafka.sasl.jaas.config": "secret-jaas"})
    assert "secret-jaas" not in str(e.value)


@pytest.mark.parametrize(
    ("given", "needle"),
    [
        pytest.param({}, "kafka.bootstrap.servers: is required", id="no-servers"),
        pytest.param({**BASE, "kafka.value.serializer": "x"}, "written as binary", id="serializer"),
        pytest.param({**BASE, "kafka.transactional.id": "x"}, "transactional=true", id="transactional-id"),
        pytest.param({**BASE, "transactional": "perhaps"}, "not a boolean", id="bad-bool"),
    ],
)
def test_sink_option_errors(given: dict[str, Any], needle: str) -> None:
    with pytest.raises(OptionsError) as e:
        SINK_OPTIONS.parse(given, connector="kafka", role="sink")
    assert needle in str(e.value)


def test_plugin_module_does_not_import_the_client() -> None:
    import subprocess
    import sys

    code = ("import sys, headrace_kafka._plugin as p; p.headrace_connectors(); "
            "assert 'confluent_kafka' not in sys.modules, 'client imported eagerly'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)
    spec = registry().get("kafka")
    assert spec.requires == ("confluent_kafka",) and "confluent-kafka" in spec.install_hint


@pytest.mark.parametrize("schema", [pytest.param(SOURCE_OPTIONS, id="source"), pytest.param(SINK_OPTIONS, id="sink")])
@pytest.mark.parametrize(
    ("value", "needle"),
    [
        pytest.param("0", "shorter than the minimum", id="zero"),
        pytest.param("-5 seconds", "shorter than the minimum", id="negative"),
        pytest.param("nan seconds", "not a duration", id="nan"),
        pytest.param("1e400 seconds", "not a duration", id="overflow"),
        pytest.param("soon", "not a duration", id="words"),
    ],
)
def test_connect_timeout_is_validated_before_any_io(schema: Any, value: str, needle: str) -> None:
    extra = {"subscribe": "a"} if schema is SOURCE_OPTIONS else {}
    with pytest.raises(OptionsError) as e:
        schema.parse({**BASE, **extra, "connectTimeout": value}, connector="kafka")
    assert "connectTimeout" in str(e.value) and needle in str(e.value)


def test_connect_timeout_defaults_to_30_seconds_and_parses_durations() -> None:
    assert src(subscribe="a")["connectTimeout"] == 30.0 and src(subscribe="a", connectTimeout="5s")["connectTimeout"] == 5.0
    assert SINK_OPTIONS.parse(BASE, connector="kafka")["connectTimeout"] == 30.0
    assert SINK_OPTIONS.parse({**BASE, "connectTimeout": "1 minute"}, connector="kafka")["connectTimeout"] == 60.0

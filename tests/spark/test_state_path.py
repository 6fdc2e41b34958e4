"""``headraceStatePath`` under Spark: required only by sources that keep state
(``Source.needs_state_path``); cloudFiles derives it from ``cloudFiles.schemaLocation``. Parsing
only: no Spark session (fast)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from headrace.errors import OptionsError
from headrace.plugins import registry
from headrace.protocols import Source
from headrace.spark.source import parse_source_options, source_context

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("connector, options", [
    ("rate-micro-batch", {"rowsPerBatch": "5"}),
    ("memory", {"name": "x"}),
    ("delta", {"path": "/tmp/some-table"}),
    ("kafka", {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "t"}),
    ("kinesis", {"streamName": "s", "region": "us-east-1"}),
], ids=["rate-micro-batch", "memory", "delta", "kafka", "kinesis"])  # fmt: skip
def test_sources_without_state_need_no_state_path(connector: str, options: dict[str, str]) -> None:
    spec = registry().get(connector)
    assert cast(type[Source], spec.load_source()).needs_state_path is False
    _opts, state = parse_source_options(spec, options)
    assert state is None
    ctx = source_context(state, None)
    assert ctx.state_path is None and ctx.query_id == ""


def test_cloudfiles_state_defaults_under_its_schema_location(tmp_path: Path) -> None:
    spec = registry().get("cloudFiles")
    raw = {"path": str(tmp_path / "in"), "cloudFiles.format": "json", "cloudFiles.schemaLocation": str(tmp_path / "s")}
    _opts, state = parse_source_options(spec, raw)
    assert state == str(tmp_path / "s" / "_headrace_state")
    _opts, state = parse_source_options(spec, {**raw, "headraceStatePath": str(tmp_path / "explicit")})
    assert state == str(tmp_path / "explicit")  # an explicit folder wins


@pytest.mark.parametrize("connector, options", [
    ("rate", {"rowsPerSecond": "5"}),
    ("cloudFiles", {"path": "/tmp/in", "cloudFiles.format": "text"}),  # fixed schema: no schemaLocation
    ("pubsub", {"projectId": "p", "topicId": "topic", "subscriptionId": "sub"}),
], ids=["rate", "cloudfiles-without-schema-location", "pubsub"])  # fmt: skip
def test_stateful_sources_without_anything_to_derive_ask_for_it(connector: str, options: dict[str, str]) -> None:
    spec = registry().get(connector)
    assert cast(type[Source], spec.load_source()).needs_state_path is True
    with pytest.raises(OptionsError, match=rf"headraceStatePath: is required under Spark for the {connector} source"):
        parse_source_options(spec, options)
    _opts, state = parse_source_options(spec, {**options, "headraceStatePath": "/tmp/st"})
    assert state == "/tmp/st"


def test_bad_options_are_reported_without_a_state_path_complaint() -> None:
    with pytest.raises(OptionsError) as e:
        parse_source_options(registry().get("rate"), {"rowsPerSecond": "many"})
    assert "rowsPerSecond" in str(e.value) and "headraceStatePath" not in str(e.value)


def test_the_default_is_off_on_the_base_class() -> None:
    assert Source.needs_state_path is False
    assert Source.default_state_path(None) is None  # type: ignore[arg-type]

"""Hostile option values: every value of every option of every installed connector either
parses or raises ``OptionsError``, at ``load()`` / ``start()``, before any I/O.

A deterministic sweep tries a fixed list of values known to have escaped before (huge numbers,
deep JSON, unicode digits, bad globs...) on every option; a hypothesis property then throws
random values of every kind at random options. Each value is given next to a valid base set of
options, so cross-option rules run on it too.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import headrace as hr
import headrace.testing
from headrace.errors import HeadraceError, OptionsError
from headrace.options import OptionSchema
from headrace.plugins import registry

# a valid set of options per connector role, so that rules run on the hostile value too
BASE: dict[tuple[str, str], dict[str, Any]] = {
    ("cloudFiles", "source"): {"path": "/tmp/hr-in", "cloudFiles.format": "json"},
    ("delta", "source"): {"path": "/tmp/hr-table"},
    ("delta", "sink"): {"path": "/tmp/hr-table"},
    ("files", "sink"): {"path": "/tmp/hr-files"},
    ("foreach_batch", "sink"): {"function": lambda t, i: None},
    ("kafka", "source"): {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "t"},
    ("kafka", "sink"): {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t"},
    ("kinesis", "source"): {"streamName": "s", "region": "us-east-1"},
    ("kinesis", "sink"): {"streamName": "s", "region": "us-east-1"},
    ("lakebase", "sink"): {"dbtable": "public.t", "host": "127.0.0.1"},
    ("lakebase", "source"): {"dbtable": "public.t", "host": "127.0.0.1"},
    ("memory", "source"): {"name": "m"},
    ("memory", "sink"): {"queryName": "m"},
    ("pubsub", "source"): {"subscriptionId": "sub", "projectId": "proj", "topicId": "top"},
    ("pubsub", "sink"): {"projectId": "proj", "topicId": "top"},
    ("rate-micro-batch", "source"): {"rowsPerBatch": 10},
    ("sqlite", "source"): {"path": "/tmp/hr.sqlite", "table": "t"},
    ("sqlite", "sink"): {"path": "/tmp/hr.sqlite", "table": "t"},
}

HOSTILE: list[Any] = [
    "", " ", "\x00", "\n", "é", "²", "٣", "一", "-", "+", ".", "1e999", "-1e999", "nan", "inf", "-inf",
    "9" * 400, "9" * 5000, 10**400, -(10**400), 2**63, 2**64, -(2**63) - 1, "99999999999999999999",
    "-99999999999999999999", "0x10", "1_000", "1.5", "-1", "0", -1, 0, 1.5, float("nan"), float("inf"),
    True, False, [], {}, [1, "a"], {"a": [1]}, b"bytes", object(), lambda: 1,
    "[" * 5000, "{" * 5000, '{"a":' * 3000, '{"t": {"²": 1}}', '{"t": {"0": 1e999}}', '{"t": [1e999]}',
    '{"t": {"99999999999999999999": 1}}', '{"t": [99999999999999999999]}', '{"t": {"0": -99999999999999999999}}',
    "*.{json", "[", "a{b", "{{{}", "*.[", "(?P<", "\\", "99999999999 days", "9" * 400 + " days", "1 fortnight",
    "-5 seconds", "5 secondss", "9" * 400 + "g", "1.5.5g", "0k", "9999-12-31T23:59:59+14:00",
    "0001-01-01T00:00:00-14:00", "2024-13-45", "a,b,,c", ",,,", "a" * 100_000, "'; DROP TABLE t; --",
    "${jndi:ldap://x}", "../../../../etc/passwd", "s3://", "postgresql://u:p%zz@h/db", "file:///dev/null",
]  # fmt: skip


def _roles() -> list[tuple[str, str, OptionSchema]]:
    out = []
    for spec in registry().specs():
        for role, schema, has in (("source", spec.source_options, spec.source), ("sink", spec.sink_options, spec.sink)):
            if has:
                out.append((spec.name, role, schema))
    return out


ROLES = _roles()
TARGETS = [(c, r, s, o.name) for c, r, s in ROLES for o in s.options]


def _base(connector: str, role: str) -> dict[str, Any]:
    return dict(BASE.get((connector, role), {}))


def _check(connector: str, role: str, schema: OptionSchema, name: str, value: Any) -> None:
    raw = {**_base(connector, role), name: value}
    try:
        opts = schema.parse(raw, connector=connector, role=role)
    except OptionsError as e:
        assert len(str(e)) < 20_000, "an options error must not quote a huge value in full"
        return
    # what parsed is usable: finite numbers within 64 bits
    v = opts[name]
    if isinstance(v, float):
        assert math.isfinite(v)
    if isinstance(v, int):
        assert -(2**63) <= v < 2**63


@pytest.mark.parametrize(("connector", "role"), [pytest.param(c, r, id=f"{c}-{r}") for c, r, _ in ROLES])
def test_base_options_are_valid(connector: str, role: str) -> None:
    schema = next(s for c, r, s in ROLES if (c, r) == (connector, role))
    schema.parse(_base(connector, role), connector=connector, role=role)


def test_every_known_hostile_value_on_every_option() -> None:
    t0 = time.monotonic()
    for connector, role, schema, name in TARGETS:
        for value in HOSTILE:
            try:
                _check(connector, role, schema, name, value)
            except AssertionError:
                raise
            except Exception as e:
                raise AssertionError(f"{connector} {role} option {name}={str(value)[:60]!r}: {type(e).__name__}: {e}") from e
    assert time.monotonic() - t0 < 20


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)
numbers_with_units = st.builds(
    lambda n, u: f"{n}{u}",
    st.one_of(st.integers(), st.floats(allow_nan=True, allow_infinity=True), st.text("0123456789.-+e²٣", max_size=30)),
    st.sampled_from(["", " ", "s", " seconds", "ms", " days", "k", "g", "tb", " fortnights", "x"]),
)
hostile_values = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=50),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.binary(max_size=20),
    json_values,
    json_values.map(lambda v: __import__("json").dumps(v)),
    numbers_with_units,
)


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(target=st.sampled_from(TARGETS), value=hostile_values)
def test_random_hostile_values_parse_or_raise_options_error(target: tuple[Any, ...], value: Any) -> None:
    connector, role, schema, name = target
    try:
        _check(connector, role, schema, name, value)
    except AssertionError:
        raise
    except Exception as e:
        raise AssertionError(f"{connector} {role} option {name}={str(value)[:60]!r}: {type(e).__name__}: {e}") from e


# ----------------------------------------------------------------- the escapes found before


def test_a_bad_glob_fails_at_load_not_at_start(tmp_path: Any) -> None:
    if "cloudFiles" not in registry().names():
        pytest.skip("headrace-cloudfiles is not installed")
    reader = hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json").option("pathGlobFilter", "*.{json")
    with pytest.raises(OptionsError, match="pathGlobFilter"):
        reader.load(str(tmp_path))


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"processing_time": "99999999999 days"}, id="processing-time-too-long"),
        pytest.param({"processingTime": "9" * 400}, id="processing-time-overflow"),
        pytest.param({"real_time": 10**400}, id="real-time-overflow"),
        pytest.param({"processing_time": "nan"}, id="nan"),
        pytest.param({"processing_time": "-1 s"}, id="negative"),
        pytest.param({"available_now": "yes please"}, id="not-a-bool"),
    ],
)
def test_trigger_intervals_are_checked_when_set(kwargs: dict[str, Any]) -> None:
    w = hr.read_stream.format("rate").load().write_stream.format("noop")
    with pytest.raises(HeadraceError):
        w.trigger(**kwargs)


def test_longest_trigger_interval_still_runs_batches() -> None:
    """A year-long interval is accepted, and the query stops at once (no overflow in the wait)."""
    q = (hr.read_stream.format("rate-micro-batch").option("rowsPerBatch", 5).load().write_stream.format("noop")
         .trigger(processing_time="365 days").start())  # fmt: skip
    hr.testing.wait_for(lambda: q.last_progress is not None, timeout=30)
    t0 = time.monotonic()
    q.stop()
    assert time.monotonic() - t0 < 5
    assert q.exception() is None


def test_a_bad_regex_fails_at_load() -> None:
    if "delta" not in registry().names():
        pytest.skip("headrace-delta is not installed")
    with pytest.raises(OptionsError, match="excludeRegex: '\\(' is not a valid regular expression"):
        hr.read_stream.format("delta").option("excludeRegex", "(").load("/tmp/t")


def test_an_s3_url_without_a_bucket_is_a_clear_error(tmp_path: Any) -> None:
    if "cloudFiles" not in registry().names():
        pytest.skip("headrace-cloudfiles is not installed")
    frame = (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
             .option("cloudFiles.schemaLocation", str(tmp_path / "s")).load("s3://"))  # fmt: skip
    with pytest.raises(HeadraceError, match="has no bucket"):
        frame.write_stream.format("noop").option("checkpointLocation", str(tmp_path / "c")).start()


# the values most likely to break a constructor (building a source costs ~20 ms: not all of HOSTILE)
START_VALUES: list[Any] = ["", " ", "é", "-1", "0", 0, -1, True, [], {}, "9" * 400, 10**400, "99999999999999999999",
                           "[", "*.{json", "../../../../etc/passwd", "file:///dev/null", "s3://", "a,b,,c", "9" * 300 + "g",
                           2**62, "9223372036854775807"]  # fmt: skip

# connectors whose constructors do no network I/O: a value that parsed must also start
LOCAL = {("rate", "source"), ("rate-micro-batch", "source"), ("memory", "source"), ("files", "sink"),
         ("console", "sink"), ("noop", "sink"), ("memory", "sink"), ("delta", "source"), ("delta", "sink"),
         ("cloudFiles", "source")}  # fmt: skip


@pytest.mark.parametrize(("connector", "role"), [pytest.param(c, r, id=f"{c}-{r}") for c, r, _ in ROLES if (c, r) in LOCAL])
def test_hostile_values_that_parse_also_start(connector: str, role: str, tmp_path: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """What ``start()`` does with the options (build the source or sink, ask the schema and the
    initial offset) raises only headrace's errors for any value that parsed."""
    monkeypatch.chdir(tmp_path)  # relative hostile paths land here
    import pyarrow as pa

    from headrace.protocols import SinkContext, SourceContext

    spec = registry().get(connector)
    schema = spec.source_options if role == "source" else spec.sink_options
    cls = spec.load_source() if role == "source" else spec.load_sink()
    if connector == "delta":
        from deltalake import write_deltalake

        write_deltalake(str(tmp_path / "table"), pa.table({"value": [1]}))
    base = {k: (str(tmp_path / "table") if k == "path" else v) for k, v in _base(connector, role).items()}
    if connector == "cloudFiles":
        (tmp_path / "table").mkdir(exist_ok=True)
        (tmp_path / "table" / "a.json").write_text('{"value": 1}\n')
        base["cloudFiles.schemaLocation"] = str(tmp_path / "schema")
    n = 0
    # few options: every value on each; many: a rotating share per option (every value is tried on some)
    per_option = len(START_VALUES) if len(schema.options) <= 10 else 8
    for j, opt in enumerate(schema.options):
        for k in range(per_option):
            value = START_VALUES[(j * per_option + k) % len(START_VALUES)]
            try:
                opts = schema.parse({**base, opt.name: value}, connector=connector, role=role)
            except OptionsError:
                continue
            n += 1
            state = tmp_path / f"state-{n}"
            state.mkdir()
            try:
                if role == "source":
                    src = cls(opts, SourceContext(query_id="q", state_path=str(state)))
                    try:
                        _ = src.schema
                        src.initial_offset()
                    finally:
                        src.close()
                else:
                    cls(opts, SinkContext(query_id="q", state_path=str(state), schema=pa.schema([("value", pa.int64())]))).close()
            except HeadraceError:
                continue
            except Exception as e:
                raise AssertionError(f"{connector} {role} {opt.name}={str(value)[:60]!r}: {type(e).__name__}: {e}") from e
    assert n > 0 or not schema.options


@pytest.mark.parametrize("role", ["source", "sink"])
def test_kafka_client_settings_are_checked_at_load(role: str) -> None:
    """``kafka.*`` pass-through settings go to librdkafka: a bad name or value is an options
    error at load()/start(), not a KafkaException in the first batch."""
    if "kafka" not in registry().names():
        pytest.skip("headrace-kafka is not installed")
    schema = registry().get("kafka").source_options if role == "source" else registry().get("kafka").sink_options
    base = _base("kafka", role)
    for key in ("kafka.linger.ms", "kafka.fetch.wait.max.ms", "kafka.no.such.setting", "kafka.AWS_SECRET_ACCESS_KEY"):
        for value in ["abc", "-5", "9" * 400, "", "\x00"]:
            with pytest.raises(OptionsError, match="kafka"):
                schema.parse({**base, key: value}, connector="kafka", role=role)
    schema.parse({**base, "kafka.client.id": "me", "kafka.socket.timeout.ms": "5000"}, connector="kafka", role=role)

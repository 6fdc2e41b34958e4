from __future__ import annotations

import datetime as dt

import pytest

from headrace.errors import OptionsError
from headrace.options import (
    Boolean,
    Choice,
    Duration,
    Integer,
    Json,
    OneOf,
    Option,
    Options,
    OptionSchema,
    PassThrough,
    Secret,
    Size,
    String,
    StringList,
    Timestamp,
    all_or_none,
    at_most_one_of,
    exactly_one_of,
)

SCHEMA = OptionSchema(
    [
        Option("maxFilesPerTrigger", Integer(min=1), default=1000, doc="files per batch"),
        Option("startingVersion", OneOf(Integer(min=0), Choice("latest"))),
        Option("startingTimestamp", Timestamp()),
        Option("subscribe", StringList()),
        Option("subscribePattern", String()),
        Option("txnAppId", String()),
        Option("txnVersion", Integer(min=0)),
        Option("password", String(), secret=True),
        Option("useNotifications", Boolean(), default=False),
        Option("queueUrl", String(), unsupported="AWS SQS queues are not supported; use directory listing"),
        Option("mode", Choice("append", "complete")),
    ],
    rules=[
        at_most_one_of("startingVersion", "startingTimestamp"),
        exactly_one_of("subscribe", "subscribePattern"),
        all_or_none("txnAppId", "txnVersion"),
    ],
    passthrough=[PassThrough("kafka.", doc="client config")],
)


def parse(**raw: object) -> Options:
    return SCHEMA.parse({"subscribe": "t", **raw}, connector="demo", role="source")


@pytest.mark.parametrize(
    ("typ", "raw", "expected"),
    [
        (Integer(), "42", 42),
        (Integer(), 7, 7),
        (Boolean(), "TRUE", True),
        (Boolean(), "off", False),
        (Duration(), "100 milliseconds", 0.1),
        (Duration(), "5 minutes", 300.0),
        (Duration(), "10s", 10.0),
        (Duration(), "1.5h", 5400.0),
        (Duration(unit="ms"), 250, 0.25),
        (Size(), "10g", 10 * 1024**3),
        (Size(), "512k", 512 * 1024),
        (Size(), "1.5 MB", int(1.5 * 1024**2)),
        (Size(), 100, 100),
        (StringList(), "a, b ,c", ["a", "b", "c"]),
        (Json(), '{"t": {"0": 5}}', {"t": {"0": 5}}),
        (Timestamp(), "2024-05-01", dt.datetime(2024, 5, 1, tzinfo=dt.UTC)),
        (Timestamp(), "2024-05-01T12:00:00Z", dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)),
        (Timestamp(), "1714564800000", dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC)),
        (Choice("addNewColumns", "rescue"), "RESCUE", "rescue"),
    ],
    ids=lambda v: str(v) if not isinstance(v, object) or isinstance(v, str | int | float) else None,
)
def test_values_are_coerced_by_type(typ: object, raw: object, expected: object) -> None:
    assert typ.parse(raw) == expected  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("typ", "raw", "fragment"),
    [
        (Integer(min=1), "0", "less than the minimum 1"),
        (Integer(), "ten", "is not an integer"),
        (Boolean(), "maybe", "use true or false"),
        (Duration(), "5 fortnights", "'100 milliseconds'"),
        (Size(), "lots", "'10g'"),
        (Timestamp(), "yesterday", "not a timestamp"),
        (Choice("append", "complete"), "apend", "did you mean 'append'"),
        (Json(), "{bad", "not valid JSON"),
    ],
    ids=["int-min", "int-word", "bool", "duration-unit", "size", "timestamp", "choice-typo", "json"],
)
def test_bad_values_say_what_is_expected(typ: object, raw: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=None) as e:
        typ.parse(raw)  # type: ignore[attr-defined]
    assert fragment in str(e.value)


def test_names_are_case_insensitive_and_defaults_fill_in() -> None:
    opts = parse(MAXFILESPERTRIGGER="5", startingversion="latest")
    assert opts["maxFilesPerTrigger"] == 5
    assert opts["maxfilespertrigger"] == 5
    assert opts["startingVersion"] == "latest"
    assert opts["useNotifications"] is False
    assert opts.is_set("startingVersion") and not opts.is_set("useNotifications")


def test_every_problem_is_reported_at_once_with_suggestions() -> None:
    with pytest.raises(OptionsError) as e:
        SCHEMA.parse(
            {"maxFilesPerTriger": "5", "startingVersion": "abc", "subscribe": "a", "subscribePattern": "b",
             "txnAppId": "x", "queueUrl": "q"},
            connector="demo", role="source",
        )  # fmt: skip
    msg = str(e.value)
    assert "5 problems" in msg
    assert "unknown option (did you mean 'maxFilesPerTrigger'?)" in msg
    assert "startingVersion: 'abc' is not int or latest" in msg
    assert "set exactly one of subscribe, subscribePattern" in msg
    assert "txnAppId is set but txnVersion is not" in msg
    assert "queueUrl: not supported by headrace: AWS SQS" in msg
    assert "headrace describe demo" in msg
    assert {p.option for p in e.value.problems} >= {"maxFilesPerTriger", "startingVersion", "queueUrl"}


def test_conflicting_options_are_named() -> None:
    with pytest.raises(OptionsError, match="startingVersion / startingTimestamp: cannot be used together"):
        parse(startingVersion=1, startingTimestamp="2024-01-01")


def test_required_option_missing() -> None:
    schema = OptionSchema([Option("path", String(), required=True, doc="where the data is")])
    with pytest.raises(OptionsError, match="path: is required: where the data is"):
        schema.parse({}, connector="x")


def test_secrets_never_appear_in_reprs_or_errors() -> None:
    opts = parse(password="hunter2", **{"kafka.sasl.password": "s3cret", "kafka.acks": "all"})
    assert isinstance(opts["password"], Secret)
    assert opts.reveal("password") == "hunter2"
    text = repr(opts) + str(opts.redacted()) + repr(opts["password"]) + str(opts["password"])
    assert "hunter2" not in text and "s3cret" not in text
    assert opts.passthrough("kafka.") == {"sasl.password": "s3cret", "acks": "all"}
    schema = OptionSchema([Option("password", Integer(), secret=True)])
    with pytest.raises(OptionsError) as e:
        schema.parse({"password": "hunter2"}, connector="x")
    assert "hunter2" not in str(e.value)


def test_passthrough_keeps_prefix_and_case() -> None:
    opts = parse(**{"kafka.bootstrap.servers": "h:1"})
    assert opts.passthrough("kafka.") == {"bootstrap.servers": "h:1"}
    assert opts.passthrough("kafka.", strip=False) == {"kafka.bootstrap.servers": "h:1"}


def test_same_option_twice_in_different_case_is_an_error() -> None:
    with pytest.raises(OptionsError, match="given twice"):
        parse(maxFilesPerTrigger=1, maxfilespertrigger=2)


def test_render_lists_every_option_and_rule() -> None:
    text = SCHEMA.render("source options:")
    for name in ("maxFilesPerTrigger", "startingVersion", "kafka.*", "UNSUPPORTED: AWS SQS"):
        assert name in text
    assert "(secret)" in text
    assert "exactly one of subscribe, subscribePattern" in text


def test_options_pickle_keeps_secrets_hidden() -> None:
    import pickle

    opts = parse(password="pw")
    again = pickle.loads(pickle.dumps(opts))
    assert again.reveal("password") == "pw"
    assert "pw'" not in repr(again)


def test_defaults_are_parsed_like_given_values() -> None:
    schema = OptionSchema([Option("period", Duration(), default="10 seconds"), Option("size", Size(), default="1m")])
    opts = schema.parse({})
    assert opts["period"] == 10.0 and opts["size"] == 1 << 20
    assert "10 seconds" in schema.render("x")
    with pytest.raises(ValueError, match="option 'period': bad default 'soon'"):
        OptionSchema([Option("period", Duration(), default="soon")])

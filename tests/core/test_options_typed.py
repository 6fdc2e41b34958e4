"""Typed option handles: ``Option[int](...)`` declarations read back as ``options[HANDLE]``, string
keys still work, and ``read_limit=`` declarations give the source's default read limit."""

from __future__ import annotations

import pickle

import pytest

from headrace.options import Duration, Integer, Option, OptionSchema, Size, String
from headrace.protocols import ReadLimit, Source, SourceContext

MAX_FILES = Option[int]("maxFilesPerTrigger", Integer(min=1), default=1000, read_limit="max_files")
MAX_BYTES = Option[int]("maxBytesPerTrigger", Size(), read_limit="max_bytes")
DELAY = Option[float]("maxTriggerDelay", Duration(), read_limit="max_trigger_delay")
PATH = Option[str]("path", String(), required=True)
SCHEMA = OptionSchema([MAX_FILES, MAX_BYTES, DELAY, PATH])


def test_handles_and_string_keys_read_the_same_value() -> None:
    opts = SCHEMA.parse({"maxfilespertrigger": "7", "path": "/x"})
    assert opts[MAX_FILES] == opts["maxFilesPerTrigger"] == 7
    assert opts[PATH] == "/x"
    assert MAX_FILES in opts and opts.is_set(MAX_FILES) and not opts.is_set(MAX_BYTES)
    assert opts.reveal(PATH) == "/x"


def test_read_limit_is_derived_from_the_declarations() -> None:
    opts = SCHEMA.parse({"path": "/x", "maxBytesPerTrigger": "1k", "maxTriggerDelay": "2 seconds"})
    assert opts.read_limit() == ReadLimit(max_files=1000, max_bytes=1024, max_trigger_delay=2.0)
    again = pickle.loads(pickle.dumps(opts))
    assert again.read_limit() == opts.read_limit()


def test_sources_get_the_derived_limit_by_default() -> None:
    class S(Source):
        schema = None

        def initial_offset(self):  # type: ignore[no-untyped-def]
            return {}

        def latest_offset(self, start, limit):  # type: ignore[no-untyped-def]
            return start

        def partitions(self, start, end):  # type: ignore[no-untyped-def]
            return []

        def read(self, partition):  # type: ignore[no-untyped-def]
            return iter(())

    src = S(SCHEMA.parse({"path": "/x", "maxFilesPerTrigger": 3}), SourceContext())
    assert src.default_read_limit() == ReadLimit(max_files=3)


def test_a_bad_read_limit_field_fails_at_declaration() -> None:
    with pytest.raises(ValueError, match="read_limit='max_apples' is not one of"):
        Option[int]("x", Integer(), read_limit="max_apples")

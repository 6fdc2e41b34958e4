"""The plugin SDK (headrace.helpers) and the one redaction module: the old import paths keep
working for one release and name the very same objects; the duplicated constants are one."""

from __future__ import annotations

import importlib

import pytest

# (old module, new module, names that must be the same objects in both)
MOVED = [
    ("headrace.engine.crash", "headrace.helpers.crash", ["CRASH_ENV", "KILL_AFTER_ENV", "TRACE_ENV", "CrashHook", "crash_point"]),
    ("headrace.transforms.auto_cdc", "headrace.helpers.auto_cdc",
     ["AUTO_CDC_OPTIONS", "AUTO_CDC_RULES", "CHANGE_TYPE", "DELETE", "SEQ", "AutoCdcError", "AutoCdcSpec",
      "delete_mask", "last_per_key", "prepare", "release_sql", "sort_events"]),
    ("headrace.badrecords", "headrace.helpers.badrecords", ["BAD_RECORD_OPTIONS", "BadRecord", "BadRecords"]),
    ("headrace.errors", "headrace.redaction",
     ["RedactingLogRecord", "redact", "redact_url", "register_secret", "scrub_exception"]),
]  # fmt: skip


@pytest.mark.parametrize(("old", "new", "names"), MOVED, ids=[m[0] for m in MOVED])
def test_old_paths_re_export_the_sdk_objects(old: str, new: str, names: list[str]) -> None:
    before, after = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(before, name) is getattr(after, name), f"{old}.{name} is not {new}.{name}"
        assert name in after.__all__


def test_history_redact_is_the_redaction_modules_record_redaction() -> None:
    from headrace import history, redaction

    assert history.redact is redaction.redact_record
    assert redaction.redact_record({"password": "p", "url": "s3://u:pw@host/x", "n": 1}) == {
        "password": "***", "url": "s3://***@host/x", "n": 1,
    }  # fmt: skip


def test_errors_defines_only_the_exception_hierarchy() -> None:
    from headrace import errors

    defined = {
        n
        for n, v in vars(errors).items()
        if getattr(v, "__module__", None) == "headrace.errors" and callable(v)
    }
    assert all(isinstance(getattr(errors, n), type) for n in defined), sorted(defined)


def test_secret_markers_are_one_list() -> None:
    from headrace.options import PassThrough
    from headrace.redaction import SECRET_MARKERS

    assert PassThrough("x.").secret_markers is SECRET_MARKERS


def test_duplicated_constants_are_one() -> None:
    from headrace.api.writer import STATE_STORES
    from headrace.plugins import discovery, hookspecs
    from headrace.state.store import BACKENDS

    assert STATE_STORES is BACKENDS
    assert discovery.PLUGINS_ENV is hookspecs.PLUGINS_ENV


def test_durable_helpers_are_the_storage_layers() -> None:
    from headrace.checkpoint import atomic_write
    from headrace.helpers import durable

    assert durable.atomic_write is atomic_write

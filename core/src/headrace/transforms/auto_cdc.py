"""Old home of the AUTO CDC helpers, kept for one release: they live in
:mod:`headrace.helpers.auto_cdc` (the plugin SDK). Import from there."""

from __future__ import annotations

from headrace.helpers.auto_cdc import (
    AUTO_CDC_OPTIONS,
    AUTO_CDC_RULES,
    CHANGE_TYPE,
    DELETE,
    SEQ,
    AutoCdcError,
    AutoCdcSpec,
    delete_mask,
    last_per_key,
    prepare,
    release_sql,
    sort_events,
)

__all__ = [
    "AUTO_CDC_OPTIONS",
    "AUTO_CDC_RULES",
    "CHANGE_TYPE",
    "DELETE",
    "SEQ",
    "AutoCdcError",
    "AutoCdcSpec",
    "last_per_key",
    "delete_mask",
    "prepare",
    "release_sql",
    "sort_events",
]

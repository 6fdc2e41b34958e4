"""Bad records for connectors (the plugin SDK's name for :mod:`headrace.badrecords`).

The ``badRecordsPolicy`` / ``badRecordsPath`` / ``maxBadRecords`` options
(:data:`BAD_RECORD_OPTIONS`), one rejected record (:class:`BadRecord`) and the policy that fails,
drops or writes them (:class:`BadRecords`). The implementation stays in :mod:`headrace.badrecords`
(a layer below the transforms, which use it too); plugins import it from here.
"""

from __future__ import annotations

from headrace.badrecords import (
    BAD_RECORD_OPTIONS,
    DEAD_LETTER_SCHEMA,
    BadRecord,
    BadRecords,
    BadRecordsError,
    JsonObject,
    read_dead_letters,
)

__all__ = [
    "BAD_RECORD_OPTIONS",
    "DEAD_LETTER_SCHEMA",
    "BadRecord",
    "BadRecords",
    "BadRecordsError",
    "JsonObject",
    "read_dead_letters",
]

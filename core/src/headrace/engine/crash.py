"""Old home of the crash-point helper, kept for one release: it lives in
:mod:`headrace.helpers.crash` (the plugin SDK). Import from there."""

from __future__ import annotations

from headrace.helpers.crash import CRASH_ENV, KILL_AFTER_ENV, TRACE_ENV, CrashHook, crash_point

__all__ = ["CRASH_ENV", "KILL_AFTER_ENV", "TRACE_ENV", "CrashHook", "crash_point"]

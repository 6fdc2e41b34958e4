"""The engine: runs a query's micro-batches (``query``), reads a batch's partitions
(``reader``), runs real-time batches (``real_time``) and marks crash points for tests
(``crash``). Protocols and options know nothing of it; it knows no screen."""

from __future__ import annotations

from headrace.engine.query import StreamingQuery
from headrace.engine.trigger import SourcePlan, Transform, Trigger
from headrace.helpers.crash import CrashHook, crash_point

__all__ = ["CrashHook", "SourcePlan", "StreamingQuery", "Transform", "Trigger", "crash_point"]

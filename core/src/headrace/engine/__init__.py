"""The engine: runs a query's micro-batches (``query``: the public API; ``setup`` makes a run,
``run`` holds it, ``loop``/``planner``/``microbatch`` drive it, ``commits`` orders what becomes
durable), reads a batch's partitions (``reader``), runs real-time batches (``real_time``).
Protocols and options know nothing of it; it knows no screen."""

from __future__ import annotations

from headrace.engine.query import StreamingQuery
from headrace.engine.source_plan import SourcePlan
from headrace.engine.trigger import Trigger
from headrace.helpers.crash import CrashHook, crash_point
from headrace.transforms.stateless import Transform

__all__ = ["CrashHook", "SourcePlan", "StreamingQuery", "Transform", "Trigger", "crash_point"]

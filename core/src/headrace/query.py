"""Compatibility module: the engine now lives in ``headrace.engine`` (loop, partition reader,
real-time batches, crash points). Import from there; these names stay importable from here."""

from __future__ import annotations

from headrace.engine import SourcePlan, StreamingQuery, Transform, Trigger

__all__ = ["SourcePlan", "StreamingQuery", "Transform", "Trigger"]

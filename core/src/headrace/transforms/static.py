"""Old home of the static frames, kept for one release: they live in :mod:`headrace.api.static`
(the api layer: a static read builds a source through the engine's reader). Import from there,
or use ``hr.read`` / ``hr.StaticFrame``."""

from __future__ import annotations

from headrace.api.static import DataFrameReader, StaticFrame, read, read_source_once

__all__ = ["DataFrameReader", "StaticFrame", "read", "read_source_once"]

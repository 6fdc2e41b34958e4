"""Old home of ``StreamFrame`` and ``GroupedStream``, kept for one release: they live in
:mod:`headrace.api.stream_frame` (and are importable from ``headrace.api``)."""

from __future__ import annotations

from headrace.api.stream_frame import GroupedStream, StreamFrame

__all__ = ["GroupedStream", "StreamFrame"]

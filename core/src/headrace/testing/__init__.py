"""Test helpers for headrace and its plugins.

- :class:`SourceContract` / :class:`SinkContract`: contract suites a plugin opts into with one
  subclass each (imported lazily: they need pytest); :class:`InjectedFault`, the exception a
  sink's ``commit_fault`` fixture makes its client raise.
- :func:`memory_stream`, :class:`MemorySource`, :class:`MemorySink`: in-process streams.
- :func:`run_pipeline`, :func:`run_until_done`: run a pipeline spec in a subprocess, SIGKILLed at
  an engine crash point (``crash="mid_write:1"``) or after a delay, for crash tests.
- :func:`wait_for`: poll a condition with a deadline instead of sleeping.
"""

from __future__ import annotations

from typing import Any

from headrace.connectors.memory import MemorySink, MemorySource, MemoryStream, memory_stream, memory_table
from headrace.testing._pipeline import PipelineResult, run_pipeline, run_until_done
from headrace.testing._wait import wait_for

__all__ = [
    "CRASH_POINTS",
    "InjectedFault",
    "MemorySink",
    "MemorySource",
    "MemoryStream",
    "PipelineResult",
    "SinkContract",
    "SourceContract",
    "memory_stream",
    "memory_table",
    "row_keys",
    "run_pipeline",
    "run_until_done",
    "wait_for",
]


def __getattr__(name: str) -> Any:
    if name in ("SourceContract", "SinkContract", "CRASH_POINTS", "InjectedFault", "row_keys"):
        from headrace.testing import contract

        return getattr(contract, name)
    raise AttributeError(f"module 'headrace.testing' has no attribute {name!r}")

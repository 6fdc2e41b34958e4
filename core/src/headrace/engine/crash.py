"""Crash points: where tests make a process die, to prove that recovery loses nothing.

``HEADRACE_TEST_CRASH=point:batch`` makes the process SIGKILL itself when it reaches ``point``
while processing batch ``batch``. The engine marks ``before_offsets``, ``after_offsets``,
``mid_write``, ``before_sink_commit``, ``after_sink_commit`` and ``after_commit``; connectors
mark their own (e.g. a sink between its data and its bookkeeping) with :func:`crash_point`,
which does nothing unless the variable names that very point.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

__all__ = ["CRASH_ENV", "CrashHook", "crash_point"]

CRASH_ENV = "HEADRACE_TEST_CRASH"


@dataclass(frozen=True)
class CrashHook:
    """A parsed ``HEADRACE_TEST_CRASH`` value; callable as ``hook(point, batch_id)``."""

    point: str = ""
    batch: int = -1

    @classmethod
    def from_env(cls) -> CrashHook:
        """Read the environment variable. Called once per query run (and per ``crash_point``)."""
        spec = os.environ.get(CRASH_ENV, "")
        if not spec:
            return cls()
        point, _, batch = spec.partition(":")
        try:
            return cls(point, int(batch or 0))
        except ValueError:
            return cls(point, -1)

    def __bool__(self) -> bool:
        return bool(self.point)

    def __call__(self, point: str, batch_id: int) -> None:
        """SIGKILL this process if ``point``/``batch_id`` is the armed one; else do nothing."""
        if self.point == point and self.batch == batch_id:
            os.kill(os.getpid(), signal.SIGKILL)


def crash_point(point: str, batch_id: int) -> None:
    """Mark a crash point inside a connector (e.g. ``crash_point("lakebase_between_data_and_bookkeeping", n)``).

    Free when ``HEADRACE_TEST_CRASH`` is unset; under the contract kit it kills the process
    here so the kit can check that the restart neither loses nor duplicates rows.
    """
    if os.environ.get(CRASH_ENV):
        CrashHook.from_env()(point, batch_id)

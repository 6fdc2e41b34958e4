"""Crash points: where tests make a process die, to prove that recovery loses nothing.

``HEADRACE_TEST_CRASH=point:batch`` makes the process SIGKILL itself when it reaches ``point``
while processing batch ``batch``. The engine marks ``before_offsets``, ``after_offsets``,
``mid_write``, ``before_sink_commit``, ``after_sink_commit`` and ``after_commit``; connectors
mark their own (e.g. a sink between its data and its bookkeeping) with :func:`crash_point`,
which does nothing unless the variable names that very point.

``HEADRACE_TEST_CRASH_TRACE=/path/file`` makes every crash point the process passes append a
line ``point batch wall-time`` to that file (the contract kit uses it to find a connector's own
crash points, to time its random kills from a measured run, and to say where a kill landed).
``HEADRACE_TEST_KILL_AFTER=point:seconds`` SIGKILLs the process that many seconds after it first
passes ``point`` (a timer thread: precise to a millisecond or so, for kills inside short batches),
or when it passes ``point`` a second time, whichever comes first: with ``before_offsets`` the kill
always lands inside the first batch the process runs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

__all__ = ["CRASH_ENV", "KILL_AFTER_ENV", "TRACE_ENV", "CrashHook", "crash_point"]

CRASH_ENV = "HEADRACE_TEST_CRASH"
TRACE_ENV = "HEADRACE_TEST_CRASH_TRACE"
KILL_AFTER_ENV = "HEADRACE_TEST_KILL_AFTER"
_timer_lock = threading.Lock()
_timer: threading.Timer | None = None


def _arm_timer(spec: str, point: str) -> None:
    global _timer
    at, _, delay = spec.rpartition(":")
    if at != point:
        return
    with _timer_lock:
        if _timer is not None:  # the second pass: the first batch is over, die now
            os.kill(os.getpid(), signal.SIGKILL)
        _timer = threading.Timer(float(delay), os.kill, (os.getpid(), signal.SIGKILL))
        _timer.daemon = True
        _timer.start()


@dataclass(frozen=True)
class CrashHook:
    """A parsed ``HEADRACE_TEST_CRASH`` value; callable as ``hook(point, batch_id)``."""

    point: str = ""
    batch: int = -1
    trace: str = ""
    kill_after: str = ""

    @classmethod
    def from_env(cls) -> CrashHook:
        """Read the environment variables. Called once per query run (and per ``crash_point``)."""
        spec = os.environ.get(CRASH_ENV, "")
        trace = os.environ.get(TRACE_ENV, "")
        kill_after = os.environ.get(KILL_AFTER_ENV, "")
        if not spec:
            return cls(trace=trace, kill_after=kill_after)
        point, _, batch = spec.partition(":")
        try:
            return cls(point, int(batch or 0), trace, kill_after)
        except ValueError:
            return cls(point, -1, trace, kill_after)

    def __bool__(self) -> bool:
        return bool(self.point)

    def __call__(self, point: str, batch_id: int) -> None:
        """SIGKILL this process if ``point``/``batch_id`` is the armed one; else do nothing."""
        if self.trace:
            with open(self.trace, "a") as f:
                f.write(f"{point} {batch_id} {time.time():.6f}\n")
        if self.kill_after:
            _arm_timer(self.kill_after, point)
        if self.point == point and self.batch == batch_id:
            os.kill(os.getpid(), signal.SIGKILL)


def crash_point(point: str, batch_id: int) -> None:
    """Mark a crash point inside a connector (e.g. ``crash_point("lakebase_between_data_and_bookkeeping", n)``).

    Call it between two steps that must both happen or neither, typically in ``Sink.commit``
    between writing the rows and recording the batch id, with the batch id being committed.
    Prefix ``point`` with the connector's name. Free when neither ``HEADRACE_TEST_CRASH`` nor
    ``HEADRACE_TEST_CRASH_TRACE`` is set. The contract kit finds these points by tracing a run,
    then kills the process at each one and checks that the restart neither loses nor
    duplicates rows.
    """
    if os.environ.get(CRASH_ENV) or os.environ.get(TRACE_ENV):
        CrashHook.from_env()(point, batch_id)

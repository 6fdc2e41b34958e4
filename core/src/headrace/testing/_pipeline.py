"""Run a pipeline described as JSON in a subprocess, optionally SIGKILLed, for crash tests.

``python -m headrace.testing._pipeline '<spec json>'`` runs::

    {"source": {"format": "rate-micro-batch", "options": {...}},   # + "schema": DDL, optional
     "transform": "package.module:function",          # optional, Table -> Table
     "frame": "package.module:function",              # optional, StreamFrame -> StreamFrame
     "sink": {"format": "files", "options": {...}},
     "checkpoint": "/tmp/chk", "name": "q",
     "trigger": {"available_now": true},              # any DataStreamWriter.trigger kwargs
     "run_for": 5.0,                                  # for unbounded triggers: stop after N s
     "read_limit": {"max_rows": 10},                  # optional: replaces the source's default_read_limit()
     "commit_steps": {"batch": 3, "kill_after": 2}}   # optional: trace the sink's client calls in commit(3)

and exits 0 when the query ends, 1 (printing the error) when it fails.

``commit_steps`` traces the calls ``Sink.commit`` of that batch makes from the plugin's own code
into other libraries (its client: ``sqlite3``, ``psycopg``, ``deltalake``, ``os``...; not
builtins, pyarrow or headrace), each one a line ``kit_commit_step:<module>.<function>`` in the
crash trace; with ``kill_after: k`` the process SIGKILLs itself as the k-th such call returns,
before the next one starts: a kill between two steps of a commit, with no crash point marked.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["STEP_PREFIX", "PipelineResult", "TracePoint", "run_pipeline", "run_until_done", "split_rows"]


@dataclass(frozen=True)
class TracePoint:
    """A crash point the pipeline passed: its name, the batch id, seconds after the process started."""

    point: str
    batch: int
    at: float


@dataclass(frozen=True)
class PipelineResult:
    returncode: int
    stdout: str
    stderr: str
    trace: tuple[TracePoint, ...] = ()
    elapsed: float = 0.0

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def last_point(self) -> str:
        """Where the run was when it ended, for messages: ``"mid_write of batch 2"``."""
        if not self.trace:
            return "before its first batch"
        t = self.trace[-1]
        if t.point.startswith(STEP_PREFIX):
            return (f"just after the client call {t.point.removeprefix(STEP_PREFIX)} of the sink's commit of batch "
                    f"{t.batch} ({t.at:.2f} s after it started)")  # fmt: skip
        return f"just after {t.point} of batch {t.batch} ({t.at:.2f} s after it started)"

    def check(self) -> PipelineResult:
        """Raise with the subprocess's output unless it exited 0."""
        if self.returncode != 0:
            raise AssertionError(f"pipeline exited {self.returncode}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-5000:]}")
        return self


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [os.getcwd(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    for var in ("HEADRACE_TEST_CRASH", "HEADRACE_TEST_CRASH_TRACE", "HEADRACE_TEST_KILL_AFTER"):
        env.pop(var, None)
    env.update(extra or {})
    return env


def run_pipeline(
    spec: Mapping[str, Any],
    *,
    crash: str | None = None,
    kill_after: float | None = None,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
    trace: bool = False,
    kill_at: tuple[str, float] | None = None,
) -> PipelineResult:
    """Run ``spec`` in a fresh Python process.

    ``crash="point:batch"`` makes the engine SIGKILL itself at that point (see
    ``headrace.helpers.crash``); ``kill_after`` SIGKILLs it from outside after that many
    seconds. With ``trace`` the result lists every crash point passed, with its time
    (``HEADRACE_TEST_CRASH_TRACE``). Returns the exit status and output; ``result.killed``
    tells whether it died by SIGKILL. ``kill_at=(point, delay)`` makes it SIGKILL itself
    ``delay`` seconds after it first passes crash point ``point`` (``HEADRACE_TEST_KILL_AFTER``;
    implies ``trace``).
    """
    trace = trace or kill_at is not None
    extra = dict(env or {})
    if kill_at is not None:
        extra["HEADRACE_TEST_KILL_AFTER"] = f"{kill_at[0]}:{kill_at[1]:.6f}"
    if crash:
        extra["HEADRACE_TEST_CRASH"] = crash
    trace_file = None
    if trace:
        fd, trace_file = tempfile.mkstemp(prefix="headrace-trace-")
        os.close(fd)
        extra["HEADRACE_TEST_CRASH_TRACE"] = trace_file
    started = time.time()
    try:
        rc, out, err = _run(spec, extra, kill_after, timeout)
        elapsed = time.time() - started
        points: tuple[TracePoint, ...] = ()
        if trace_file is not None:
            with open(trace_file) as f:
                rows = [line.split() for line in f if line.strip()]
            points = tuple(TracePoint(r[0], int(r[1]), float(r[2]) - started) for r in rows if len(r) == 3)
    finally:
        if trace_file is not None:
            os.unlink(trace_file)
    return PipelineResult(rc, out, err, points, elapsed)


def _run(spec: Mapping[str, Any], extra: dict[str, str], kill_after: float | None, timeout: float) -> tuple[int, str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "headrace.testing._pipeline", json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(extra),
    )
    try:
        out, err = proc.communicate(timeout=kill_after if kill_after is not None else timeout)
    except subprocess.TimeoutExpired:
        if kill_after is None:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"pipeline did not finish within {timeout} s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-5000:]}") from None
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate()
    return proc.returncode, out, err


def split_rows(table: Any) -> Any:
    """A transform that hands each row to the sink as its own record batch, so every batch of
    two rows or more passes the engine's ``mid_write`` crash point (the source suite uses it)."""
    import pyarrow as pa

    return pa.Table.from_batches(table.combine_chunks().to_batches(max_chunksize=1), schema=table.schema)


def run_until_done(
    spec: Mapping[str, Any],
    *,
    crashes: list[str] = (),  # type: ignore[assignment]
    random_kills: int = 0,
    kill_window: tuple[float, float] = (0.3, 2.0),
    seed: int = 0,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> list[PipelineResult]:
    """Run ``spec`` once per crash point, then ``random_kills`` times SIGKILLed after a random
    delay, then once to completion (which must succeed). Returns every run's result."""
    rng = random.Random(seed)
    results = [run_pipeline(spec, crash=c, timeout=timeout, env=env) for c in crashes]
    for _ in range(random_kills):
        results.append(run_pipeline(spec, kill_after=rng.uniform(*kill_window), timeout=timeout, env=env))
    results.append(run_pipeline(spec, timeout=timeout, env=env).check())
    return results


# the calls that are computation, not a step of a commit against the sink's system
_NOT_CLIENT = frozenset({
    "builtins", "pyarrow", "numpy", "pandas", "typing", "abc", "dataclasses", "collections", "functools",
    "itertools", "operator", "logging", "json", "re", "contextlib", "threading", "enum", "copy", "warnings",
    "math", "time", "uuid", "weakref", "thread", "collections_abc", "io", "codecs", "genericpath", "posixpath",
    "headrace", "importlib", "frozen_importlib", "typing_extensions",
})  # fmt: skip
STEP_PREFIX = "kit_commit_step:"


def _trace_commit_steps(cls: Any, batch: int, kill_after: int | None) -> None:
    """Wrap ``cls.commit`` so that its call for ``batch`` traces (and with ``kill_after`` kills
    after) each call the plugin's code makes into its client."""
    from headrace.helpers.crash import TRACE_ENV

    own = tuple({c.__module__.rpartition(".")[0] or c.__module__ for c in cls.__mro__
                 if c.__module__ != "builtins" and not c.__module__.startswith("headrace.protocols")})  # fmt: skip
    trace = os.environ.get(TRACE_ENV, "")
    original = cls.commit

    def is_own(frame: Any) -> bool:
        return frame is not None and str(frame.f_globals.get("__name__", "")).startswith(own)

    def commit(self: Any, batch_id: int, messages: Any) -> Any:
        if batch_id != batch:
            return original(self, batch_id, messages)
        count = 0

        def profile(frame: Any, event: str, arg: Any) -> None:
            nonlocal count
            if event == "c_return" and is_own(frame):
                module = getattr(arg, "__module__", None) or type(getattr(arg, "__self__", None)).__module__
                name = getattr(arg, "__qualname__", getattr(arg, "__name__", "?"))
            elif event == "return" and is_own(frame.f_back) and not is_own(frame):
                module = str(frame.f_globals.get("__name__", ""))
                name = frame.f_code.co_qualname
            else:
                return
            module = str(module)
            if module.split(".")[0].lstrip("_") in _NOT_CLIENT and not module.startswith(own):
                return
            count += 1
            if trace:
                with open(trace, "a") as f:
                    f.write(f"{STEP_PREFIX}{module}.{name} {batch_id} {time.time():.6f}\n")
            if kill_after is not None and count >= kill_after:
                os.kill(os.getpid(), signal.SIGKILL)

        sys.setprofile(profile)
        try:
            return original(self, batch_id, messages)
        finally:
            sys.setprofile(None)

    cls.commit = commit


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv: list[str]) -> int:
    import headrace as hr

    spec = json.loads(argv[0])
    src = spec["source"]
    if spec.get("read_limit"):
        from headrace.plugins import registry
        from headrace.protocols import ReadLimit

        limit = ReadLimit(**spec["read_limit"])
        cls = registry().get(src["format"]).load_source()
        cls.default_read_limit = lambda self: limit  # type: ignore[attr-defined]
    reader = hr.read_stream.format(src["format"]).options(src.get("options", {}))
    if src.get("schema"):
        reader = reader.schema(src["schema"])
    frame = reader.load(src.get("path"))
    if spec.get("transform"):
        frame = frame.map_batches(_load(spec["transform"]))
    if spec.get("frame"):  # a plan: with_watermark, select_expr, group_by(...).agg(...), ...
        frame = _load(spec["frame"])(frame)
    sink = spec["sink"]
    if spec.get("commit_steps"):
        from headrace.plugins import registry

        steps = spec["commit_steps"]
        _trace_commit_steps(registry().get(sink["format"]).load_sink(), int(steps["batch"]), steps.get("kill_after"))
    writer = frame.write_stream.format(sink["format"]).options(sink.get("options", {}))
    if spec.get("checkpoint"):
        writer = writer.option("checkpointLocation", spec["checkpoint"])
    if spec.get("name"):
        writer = writer.query_name(spec["name"])
    if spec.get("output_mode"):
        writer = writer.output_mode(spec["output_mode"])
    writer = writer.trigger(**spec.get("trigger", {"available_now": True}))
    q = writer.start(sink.get("path"))
    try:
        if spec.get("run_for") is not None:
            q.await_termination(float(spec["run_for"]))
            q.stop()
        q.await_termination()
    except Exception as e:
        print(f"pipeline failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"lastProgress": q.last_progress}, default=str))
    return 0


if __name__ == "__main__":
    started = time.monotonic()
    sys.exit(main(sys.argv[1:]))

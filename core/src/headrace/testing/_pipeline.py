"""Run a pipeline described as JSON in a subprocess, optionally SIGKILLed, for crash tests.

``python -m headrace.testing._pipeline '<spec json>'`` runs::

    {"source": {"format": "rate-micro-batch", "options": {...}},   # + "schema": DDL, optional
     "transform": "package.module:function",          # optional, Table -> Table
     "frame": "package.module:function",              # optional, StreamFrame -> StreamFrame
     "sink": {"format": "files", "options": {...}},
     "checkpoint": "/tmp/chk", "name": "q",
     "trigger": {"available_now": true},              # any DataStreamWriter.trigger kwargs
     "run_for": 5.0}                                  # for unbounded triggers: stop after N s

and exits 0 when the query ends, 1 (printing the error) when it fails.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PipelineResult", "run_pipeline", "run_until_done"]


@dataclass(frozen=True)
class PipelineResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL

    def check(self) -> PipelineResult:
        """Raise with the subprocess's output unless it exited 0."""
        if self.returncode != 0:
            raise AssertionError(f"pipeline exited {self.returncode}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-5000:]}")
        return self


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [os.getcwd(), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.pop("HEADRACE_TEST_CRASH", None)
    env.update(extra or {})
    return env


def run_pipeline(
    spec: Mapping[str, Any],
    *,
    crash: str | None = None,
    kill_after: float | None = None,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> PipelineResult:
    """Run ``spec`` in a fresh Python process.

    ``crash="point:batch"`` makes the engine SIGKILL itself at that point (see
    ``headrace.engine.crash``); ``kill_after`` SIGKILLs it from outside after that many
    seconds. Returns the exit status and output; ``result.killed`` tells whether it died by
    SIGKILL.
    """
    extra = dict(env or {})
    if crash:
        extra["HEADRACE_TEST_CRASH"] = crash
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
    return PipelineResult(proc.returncode, out, err)


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


def _load(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def main(argv: list[str]) -> int:
    import headrace as hr

    spec = json.loads(argv[0])
    src = spec["source"]
    reader = hr.read_stream.format(src["format"]).options(src.get("options", {}))
    if src.get("schema"):
        reader = reader.schema(src["schema"])
    frame = reader.load(src.get("path"))
    if spec.get("transform"):
        frame = frame.map_batches(_load(spec["transform"]))
    if spec.get("frame"):  # a plan: with_watermark, select_expr, group_by(...).agg(...), ...
        frame = _load(spec["frame"])(frame)
    sink = spec["sink"]
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

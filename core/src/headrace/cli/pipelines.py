"""``headrace run FILE`` and ``headrace validate FILE`` (pipeline TOML files)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from typing import Any

__all__ = ["register"]


def _validate(args: argparse.Namespace) -> int:
    from headrace.pipeline import load_pipeline

    p = load_pipeline(args.pipeline)
    p.validate()
    p.transform_function()
    trigger = ", ".join(f"{k} = {v!r}" for k, v in p.trigger.items())
    print(f"{args.pipeline}: ok ({p.source_format} -> {p.sink_format}, trigger {trigger})")
    return 0


class _Totals:
    """Every batch's rows, counted as progress arrives (the query keeps only the last 100)."""

    def __init__(self) -> None:
        self.batches = 0
        self.input_rows = 0
        self.output_rows = 0
        self.skipped_rows = 0

    def add(self, progress: Any) -> None:
        self.batches += 1
        self.input_rows += progress.num_input_rows
        self.output_rows += max(0, progress.sink.num_output_rows)
        self.skipped_rows += int(progress.sink.metrics.get("numRowsSkipped", 0) or 0)


def _run(args: argparse.Namespace) -> int:
    from headrace.pipeline import load_pipeline
    from headrace.progress import QueryProgress

    p = load_pipeline(args.pipeline)
    p.validate()
    totals = _Totals()
    reader_gone = threading.Event()

    def show(progress: QueryProgress) -> None:
        totals.add(progress)
        try:
            print(progress.to_json() if args.json else progress.line(), flush=True)
        except BrokenPipeError:  # `headrace run p.toml | head -3`: the reader is gone; stop cleanly
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            reader_gone.set()

    q = p.start(show)
    print(f"query '{q.name or q.id}' started (id {q.id}, delivery {q.delivery_guarantee}, checkpoint {q.checkpoint_location})",
          file=sys.stderr, flush=True)  # fmt: skip
    interrupts = 0

    def interrupted(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            print("stopping (the running batch finishes first; press Ctrl-C again to stop at once)...",
                  file=sys.stderr, flush=True)  # fmt: skip
            q.stop(timeout=0)
            return
        # a second Ctrl-C: stop now. The checkpoint's write-ahead log makes this safe: the
        # running batch is replayed with the same range and id on the next run.
        print("stopped at once; the interrupted batch is replayed on the next run", file=sys.stderr, flush=True)
        os._exit(130)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    while not q.await_termination(0.2):
        if reader_gone.is_set():
            q.stop(timeout=0)
    summary = f"query '{q.name or q.id}' finished: {totals.batches:,} batches, {totals.input_rows:,} rows"
    if totals.skipped_rows:
        summary += f" ({totals.skipped_rows:,} skipped by the sink as already committed)"
    print(summary, file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add ``run`` and ``validate`` to the ``headrace`` parser's subcommands."""
    r = sub.add_parser("run", help="run a pipeline TOML file, printing progress per batch")
    r.add_argument("pipeline")
    r.add_argument("--json", action="store_true", help="print each progress report as JSON")
    r.set_defaults(fn=_run)
    v = sub.add_parser("validate", help="check a pipeline TOML file without running it (no I/O)")
    v.add_argument("pipeline")
    v.set_defaults(fn=_validate)

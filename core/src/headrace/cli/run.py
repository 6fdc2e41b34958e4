"""``headrace run FILE`` and ``headrace validate FILE``: flow files (one query in TOML, :mod:`headrace.cli.flow_file`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from typing import Any

from headrace._words import counted
from headrace.cli import say
from headrace.errors import HeadraceError

__all__ = ["register"]


def _validate(args: argparse.Namespace) -> int:
    from headrace.cli.flow_file import load_flow_file

    p = load_flow_file(args.pipeline)
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
    from headrace.cli.flow_file import load_flow_file
    from headrace.progress import QueryProgress

    p = load_flow_file(args.pipeline)
    p.validate()
    if args.metrics_port is not None:
        _serve_metrics(args.metrics_port, args.metrics_addr)
    totals = _Totals()
    reader_gone = threading.Event()

    def show(progress: QueryProgress) -> None:
        totals.add(progress)
        try:
            print(progress.to_json() if args.json or args.log_format == "json" else progress.line(), flush=True)
        except BrokenPipeError:  # `headrace run p.toml | head -3`: the reader is gone; stop cleanly
            with contextlib.suppress(OSError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            reader_gone.set()

    ui = None
    if args.ui:
        from headrace.cli.ui import ui_token
        from headrace.ui import start_ui

        ui = start_ui([p.checkpoint] if p.checkpoint else [], port=args.ui_port, host=args.ui_host, token=ui_token())
        say(f"dashboard on {ui.url}")
    q = p.start(show)
    say(f"query '{q.name or q.id}' started (id {q.id}, delivery {q.delivery_guarantee}, checkpoint {q.checkpoint_location})")
    if ui is not None and not p.checkpoint:
        ui.catalog.add(q.checkpoint_location)
    interrupts = 0

    def interrupted(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            say("stopping (the running batch finishes first; press Ctrl-C again to stop at once)...")
            q.stop(timeout=0)
            return
        # a second Ctrl-C: stop now. The checkpoint's write-ahead log makes this safe: the
        # running batch is replayed with the same range and id on the next run.
        say("stopped at once; the interrupted batch is replayed on the next run")
        os._exit(130)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    while not q.await_termination(0.2):
        if reader_gone.is_set():
            q.stop(timeout=0)
    if ui is not None:
        ui.close()
    summary = f"query '{q.name or q.id}' finished: {counted(totals.batches, 'batch')}, {counted(totals.input_rows, 'row')}"
    if totals.skipped_rows:
        summary += f" ({totals.skipped_rows:,} skipped by the sink as already committed)"
    say(summary)
    return 0


def _serve_metrics(port: int, addr: str | None) -> None:
    """Start the Prometheus endpoint of the headrace-prometheus plugin (``--metrics-port``)."""
    import importlib

    try:
        plugin = importlib.import_module("headrace_prometheus")
    except ImportError:
        raise HeadraceError(
            "--metrics-port needs the headrace-prometheus plugin, which is not installed; "
            "fix: pip install headrace-prometheus"
        ) from None
    try:
        server = plugin.serve(port, addr)
    except (OSError, ValueError) as e:
        raise HeadraceError(str(e)) from None
    say(f"serving metrics on {server.url}")


def register(sub: Any) -> None:
    """Add ``run`` and ``validate`` to the ``headrace`` parser's subcommands."""
    r = sub.add_parser("run", help="run a pipeline TOML file, printing progress per batch")
    r.add_argument("pipeline")
    r.add_argument("--json", action="store_true", help="print each progress report as JSON")
    r.add_argument("--metrics-port", type=int, metavar="N",
                   help="serve Prometheus metrics on port N (needs headrace-prometheus; 0: any free port)")
    r.add_argument("--metrics-addr", metavar="ADDR",
                   help="address for --metrics-port (default $HEADRACE_METRICS_ADDR or 127.0.0.1; 0.0.0.0: all)")
    r.add_argument("--ui", action="store_true", help="serve the dashboard beside the pipeline (needs headrace[ui])")
    r.add_argument("--ui-port", type=int, default=4040, metavar="N", help="dashboard port for --ui (default 4040)")
    r.add_argument("--ui-host", default="127.0.0.1", metavar="ADDR", help="dashboard address for --ui (default 127.0.0.1; another needs HEADRACE_UI_TOKEN)")
    r.set_defaults(fn=_run)
    v = sub.add_parser("validate", help="check a pipeline TOML file without running it (no I/O)")
    v.add_argument("pipeline")
    v.set_defaults(fn=_validate)

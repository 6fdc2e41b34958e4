"""The ``headrace`` command: connectors, describe, run, validate, checkpoint show/reset."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from headrace.errors import HeadraceError

__all__ = ["main"]

log = logging.getLogger(__name__ if __name__ != "__main__" else "headrace.cli")  # python -m headrace.cli
_json_logs = False


def _say(message: str, level: int = logging.INFO) -> None:
    """A status line for the person at the terminal, on stderr: plain text, or with
    ``--log-format json`` a JSON log record like every other line there."""
    if _json_logs:
        from headrace.logs import JsonFormatter

        record = log.makeRecord(log.name, level, __file__, 0, message, (), None)
        print(JsonFormatter().format(record), file=sys.stderr, flush=True)
    else:
        print(message, file=sys.stderr, flush=True)


def _connectors(args: argparse.Namespace) -> int:
    from headrace.plugins import registry

    reg = registry()
    rows = []
    for spec in reg.specs():
        roles = "/".join(r for r, v in (("source", spec.source), ("sink", spec.sink)) if v)
        missing = spec.missing_requirements()
        status = f"missing {', '.join(missing)}: {spec.install_hint}" if missing else "ok"
        rows.append((spec.name + (f" ({', '.join(spec.aliases)})" if spec.aliases else ""), roles,
                     spec.distribution, status, spec.description))  # fmt: skip
    headers = ("NAME", "PROVIDES", "DISTRIBUTION", "STATUS")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + "  DESCRIPTION")
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    for name, dist, error in reg.broken():
        print(f"! plugin '{name}' from {dist} failed to load: {error.splitlines()[0]}")
    for name, dists in reg.duplicates().items():
        print(f"! connector name '{name}' is claimed by {' and '.join(dists)}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    from headrace.plugins import registry

    spec = registry().get(args.name)
    print(f"{spec.name} — {spec.description}" if spec.description else spec.name)
    print(f"distribution: {spec.distribution}" + (f"; aliases: {', '.join(spec.aliases)}" if spec.aliases else ""))
    if spec.source:
        print()
        print(spec.source_options.render("source options:"))
    if spec.sink:
        print()
        print(spec.sink_options.render("sink options:"))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from headrace.pipeline import load_pipeline

    p = load_pipeline(args.pipeline)
    p.validate()
    p.transform_function()
    print(f"{args.pipeline}: ok ({p.source_format} -> {p.sink_format}, trigger {p.trigger})")
    return 0


def _run(args: argparse.Namespace) -> int:
    from headrace.pipeline import load_pipeline
    from headrace.progress import QueryProgress

    p = load_pipeline(args.pipeline)
    p.validate()
    if args.metrics_port is not None:
        _serve_metrics(args.metrics_port, args.metrics_addr)

    def show(progress: QueryProgress) -> None:
        print(progress.to_json() if args.json or _json_logs else progress.line(), flush=True)

    ui = None
    if args.ui:
        from headrace.ui import start_ui

        ui = start_ui([p.checkpoint] if p.checkpoint else [], port=args.ui_port, host=args.ui_host)
        _say(f"dashboard on {ui.url}")
    q = p.start(show)
    _say(f"query '{q.name or q.id}' started (id {q.id}, delivery {q.delivery_guarantee}, checkpoint {q.checkpoint_location})")
    if ui is not None and not p.checkpoint:
        ui.catalog.add(q.checkpoint_location)

    def interrupted(signum: int, frame: Any) -> None:
        _say("stopping (the running batch finishes first)...")
        q.stop(timeout=0)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    while not q.await_termination(0.2):
        pass
    if ui is not None:
        ui.close()
    rows = sum(x["numInputRows"] for x in q.recent_progress)
    _say(f"query '{q.name or q.id}' finished: {len(q.recent_progress)} batches, {rows:,} rows")
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
    _say(f"serving metrics on {server.url}")


def _ui(args: argparse.Namespace) -> int:
    import os

    from headrace.ui import start_ui

    for d in args.dirs:
        if not os.path.isdir(d):
            raise HeadraceError(f"{d} is not a folder; give checkpoint folders or folders that hold checkpoints")
    ui = start_ui(args.dirs or ["."], port=args.port, host=args.host, refresh_ms=args.refresh_ms)
    found = len(ui.catalog.checkpoints())
    _say(f"dashboard on {ui.url} ({found} checkpoint{'s' if found != 1 else ''} found; Ctrl-C to stop)")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    ui.close()
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    import os

    from headrace.checkpoint import Checkpoint

    if not os.path.isfile(os.path.join(args.dir, "metadata")):
        raise HeadraceError(f"{args.dir} is not a headrace checkpoint (no metadata file); give the checkpointLocation folder")
    cp = Checkpoint(args.dir)
    if args.action == "show":
        from headrace.history import query_state, read_history

        shown = cp.describe()
        shown["lastRun"] = query_state(args.dir)
        shown["recentProgress"] = read_history(args.dir, limit=args.progress)
        print(json.dumps(shown, indent=2, default=str))
        return 0
    removed = cp.reset_to(args.to_batch)
    print(f"removed batches {removed[0]}..{removed[-1]}" if removed else "nothing to remove")
    print(f"the next run continues after batch {args.to_batch}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headrace", description="Streams to the lakehouse, with Spark's semantics.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="log lines on stderr as text or as one JSON object per line (default text)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("connectors", help="list installed connectors").set_defaults(fn=_connectors)
    d = sub.add_parser("describe", help="show a connector's options")
    d.add_argument("name")
    d.set_defaults(fn=_describe)
    r = sub.add_parser("run", help="run a pipeline TOML file, printing progress per batch")
    r.add_argument("pipeline")
    r.add_argument("--json", action="store_true", help="print each progress report as JSON")
    r.add_argument("--metrics-port", type=int, metavar="N",
                   help="serve Prometheus metrics on port N (needs headrace-prometheus; 0: any free port)")
    r.add_argument("--metrics-addr", metavar="ADDR",
                   help="address for --metrics-port (default $HEADRACE_METRICS_ADDR or 127.0.0.1; 0.0.0.0: all)")
    r.add_argument("--ui", action="store_true", help="serve the dashboard beside the pipeline (needs headrace[ui])")
    r.add_argument("--ui-port", type=int, default=4040, metavar="N", help="dashboard port for --ui (default 4040)")
    r.add_argument("--ui-host", default="127.0.0.1", metavar="ADDR", help="dashboard address for --ui (default 127.0.0.1)")
    r.set_defaults(fn=_run)
    u = sub.add_parser("ui", help="serve a live web dashboard of the queries in checkpoint folders")
    u.add_argument("dirs", nargs="*", metavar="CHECKPOINT_DIR",
                   help="checkpoints, or folders holding checkpoints (searched 4 levels down; default: .)")
    u.add_argument("--port", type=int, default=4040, help="port (default 4040; 0: any free port)")
    u.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1; 0.0.0.0: all)")
    u.add_argument("--refresh-ms", type=int, default=1000, help="how often the page polls (default 1000)")
    u.set_defaults(fn=_ui)
    v = sub.add_parser("validate", help="check a pipeline TOML file's options without running it")
    v.add_argument("pipeline")
    v.set_defaults(fn=_validate)
    c = sub.add_parser("checkpoint", help="inspect or roll back a checkpoint")
    csub = c.add_subparsers(dest="action", required=True)
    s = csub.add_parser("show", help="summary of a checkpoint folder")
    s.add_argument("dir")
    s.add_argument("--progress", type=int, default=20, metavar="N",
                   help="include the last N progress records kept with the checkpoint (default 20)")
    rs = csub.add_parser("reset", help="forget batches after N (they are read again on the next run)")
    rs.add_argument("dir")
    rs.add_argument("--to-batch", type=int, required=True, help="the last batch to keep (-1: forget all)")
    c.set_defaults(fn=_checkpoint)
    from headrace.pipelines.cli import register as register_pipelines

    register_pipelines(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from headrace.logs import configure_logging

    global _json_logs
    _json_logs = args.log_format == "json"
    configure_logging(logging.INFO if args.verbose else logging.WARNING, args.log_format)
    try:
        return int(args.fn(args))
    except HeadraceError as e:
        _say(f"error: {e}", level=logging.ERROR)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``headrace pipelines ...``: init, dry-run, run, graph, events.

Registered into the ``headrace`` command by ``register(subparsers)``; everything heavy is
imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from headrace._words import counted

__all__ = ["register"]


def _names(value: str | None) -> list[str]:
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def _load(args: argparse.Namespace) -> Any:
    from headrace.pipelines.spec import load_pipeline

    return load_pipeline(args.spec)


def _init(args: argparse.Namespace) -> int:
    from headrace.pipelines.scaffold import init_project

    root = init_project(args.name)
    print(f"pipeline project {args.name!r} created in {root}. To run it:")
    print(f"  cd {args.name}")
    print("  headrace pipelines run")
    return 0


def _dry_run(args: argparse.Namespace) -> int:
    from headrace.pipelines.graph import GraphError
    from headrace.pipelines.render import render_text
    from headrace.pipelines.spec import in_dir

    if args.engine == "spark":
        return _on_spark(args, dry=True)
    p = _load(args)
    with in_dir(p.spec.base_dir):
        try:
            p.graph.analyze()
        except GraphError as e:
            print(f"pipeline {p.spec.name!r}: dry run failed", file=sys.stderr)
            for problem in e.problems:
                print(f"  - {problem}", file=sys.stderr)
            return 1
    print(render_text(p.graph, stats=True, plan=True))
    print(f"pipeline {p.spec.name!r}: ok ({counted(len(p.graph.datasets), 'dataset')}, {counted(len(p.graph.flows), 'flow')}; "
          "every definition loaded, options and expectations checked, no data read)")  # fmt: skip
    return 0


def _on_spark(args: argparse.Namespace, *, dry: bool) -> int:
    """``--engine spark``: the pipeline written as a Spark pipeline project and run by
    ``spark-pipelines`` (headrace.spark.pipelines)."""
    from headrace.spark.pipelines import project_of, run_on_spark

    p = _load(args)
    if getattr(args, "continuous", False):
        print("headrace: error: --continuous with --engine spark: spark-pipelines runs are triggered; "
              "leave out --continuous or run on headrace", file=sys.stderr)  # fmt: skip
        return 2
    project = project_of(p)
    print(f"pipeline {p.spec.name!r}: {'dry run' if dry else 'run'} on Spark Declarative Pipelines "
          f"(project {project.root}, tables in {project.warehouse})", file=sys.stderr, flush=True)  # fmt: skip
    result = run_on_spark(
        p,
        full_refresh=_names(getattr(args, "full_refresh", None)),
        full_refresh_all=bool(getattr(args, "full_refresh_all", False)),
        refresh=_names(getattr(args, "refresh", None)),
        dry=dry,
        out=lambda line: print(line, flush=True),
    )
    if result.ok:
        print(f"pipeline {p.spec.name!r}: completed on Spark", file=sys.stderr)
        return 0
    failed = f"; failed: {', '.join(result.failed_flows)}" if result.failed_flows else ""
    print(f"pipeline {p.spec.name!r}: failed on Spark (spark-pipelines exit status {result.returncode}{failed})",
          file=sys.stderr)  # fmt: skip
    return 1


def _run(args: argparse.Namespace) -> int:
    from headrace.pipelines.runner import PipelineRun

    if args.engine == "spark":
        return _on_spark(args, dry=False)
    p = _load(args)
    run = PipelineRun(
        p,
        full_refresh=_names(args.full_refresh),
        full_refresh_all=args.full_refresh_all,
        refresh=_names(args.refresh),
        continuous=args.continuous,
        out=lambda line: print(line, flush=True),
    )

    def interrupted(signum: int, frame: Any) -> None:
        print("stopping (running batches finish and commit first)...", file=sys.stderr, flush=True)
        run.stop()

    if args.continuous:
        signal.signal(signal.SIGINT, interrupted)
        signal.signal(signal.SIGTERM, interrupted)
    print(f"pipeline {p.spec.name!r}: run {run.update_id} ({'continuous' if args.continuous else 'triggered'}), "
          f"storage {p.storage.root}", file=sys.stderr, flush=True)  # fmt: skip
    result = run.run()
    from collections import Counter

    counts = Counter(s.lower() for s in result.flows.values())
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    print(f"pipeline {p.spec.name!r}: {result.state.lower()} ({counted(len(result.flows), 'flow')}: {summary}"
          + (f"; failed: {', '.join(result.errors)}" if result.errors else "") + ")", file=sys.stderr)  # fmt: skip
    return 0 if result.ok else 1


def _events(args: argparse.Namespace) -> int:
    from headrace.pipelines.events import format_event, read_events

    p = _load(args)
    events = list(read_events(p.storage.event_log))
    if not events:
        print(f"no events yet in {p.storage.event_log}", file=sys.stderr)
        return 0
    if args.last:
        last = events[-1]["origin"].get("update_id")
        events = [e for e in events if e["origin"].get("update_id") == last]
    if args.type:
        events = [e for e in events if e.get("event_type") in _names(args.type)]
    if args.flow:
        events = [e for e in events if e["origin"].get("flow_name") == args.flow]
    for e in events[-args.limit :] if args.limit else events:
        print(json.dumps(e) if args.json else format_event(e))
    return 0


def _graph(args: argparse.Namespace) -> int:
    from headrace.pipelines.render import render_text, write_picture
    from headrace.pipelines.spec import in_dir

    p = _load(args)
    with in_dir(p.spec.base_dir):
        p.graph.analyze()
    print(render_text(p.graph, stats=not args.no_stats))
    out = args.output or os.path.join(p.spec.base_dir, "graph.svg")
    written, note = write_picture(p.graph, out)
    if note:
        print(note, file=sys.stderr)
    print(f"wrote {written}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    """Add the ``pipelines`` command group to the ``headrace`` parser's subparsers."""
    spec = argparse.ArgumentParser(add_help=False)
    spec.add_argument("--spec", help="the pipeline spec (default: pipeline.yml here or in a parent folder)")
    g = sub.add_parser("pipelines", help="declarative pipelines: streaming tables, materialized views, flows")
    gs = g.add_subparsers(dest="pipelines_command", required=True)
    i = gs.add_parser("init", help="create a runnable example pipeline in folder NAME")
    i.add_argument("name")
    i.set_defaults(fn=_init)
    d = gs.add_parser(
        "dry-run", parents=[spec], help="load every definition and check the graph; no data read"
    )
    engine_help = ("headrace (default) or spark: write the pipeline as a Spark pipeline project and run "
                   "spark-pipelines on it")  # fmt: skip
    d.add_argument("--engine", choices=("headrace", "spark"), default="headrace", help=engine_help)
    d.set_defaults(fn=_dry_run)
    r = gs.add_parser("run", parents=[spec], help="run the pipeline (triggered by default)")
    fr = r.add_mutually_exclusive_group()
    fr.add_argument(
        "--full-refresh", metavar="A,B", help="truncate these datasets, reset their flows and recompute"
    )
    fr.add_argument("--full-refresh-all", action="store_true", help="full refresh of every dataset")
    r.add_argument("--refresh", metavar="A,B", help="update only these datasets")
    r.add_argument(
        "--continuous", action="store_true", help="keep every flow running with its trigger until Ctrl-C"
    )
    r.add_argument("--engine", choices=("headrace", "spark"), default="headrace", help=engine_help)
    r.set_defaults(fn=_run)
    e = gs.add_parser("events", parents=[spec], help="print the event log")
    e.add_argument("--last", action="store_true", help="only the latest run")
    e.add_argument("--type", help="only these event types (create_update,flow_progress,...)")
    e.add_argument("--flow", help="only this flow's events")
    e.add_argument("-n", "--limit", type=int, default=0, help="only the last N events")
    e.add_argument("--json", action="store_true", help="print the JSON lines as stored")
    e.set_defaults(fn=_events)
    gr = gs.add_parser("graph", parents=[spec], help="print the graph and draw it (SVG/PNG via graphviz)")
    gr.add_argument(
        "-o", "--output", help="picture to write: .svg, .png or .dot (default graph.svg next to the spec)"
    )
    gr.add_argument("--no-stats", action="store_true", help="do not read row counts and last updates")
    gr.set_defaults(fn=_graph)

"""The ``headrace`` command: connectors, describe, run, validate, checkpoint show/reset."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from headrace.errors import HeadraceError

__all__ = ["main"]


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
    from headrace._cli_authors import connectors_report

    return connectors_report(args, reg)


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

    def show(progress: QueryProgress) -> None:
        print(progress.to_json() if args.json else progress.line(), flush=True)

    q = p.start(show)
    print(f"query '{q.name or q.id}' started (id {q.id}, delivery {q.delivery_guarantee}, checkpoint {q.checkpoint_location})",
          file=sys.stderr, flush=True)  # fmt: skip

    def interrupted(signum: int, frame: Any) -> None:
        print("stopping (the running batch finishes first)...", file=sys.stderr, flush=True)
        q.stop(timeout=0)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    while not q.await_termination(0.2):
        pass
    rows = sum(x["numInputRows"] for x in q.recent_progress)
    print(f"query '{q.name or q.id}' finished: {len(q.recent_progress)} batches, {rows:,} rows", file=sys.stderr)
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    import os

    from headrace.checkpoint import Checkpoint

    if not os.path.isfile(os.path.join(args.dir, "metadata")):
        raise HeadraceError(f"{args.dir} is not a headrace checkpoint (no metadata file); give the checkpointLocation folder")
    cp = Checkpoint(args.dir)
    if args.action == "show":
        print(json.dumps(cp.describe(), indent=2, default=str))
        return 0
    removed = cp.reset_to(args.to_batch)
    print(f"removed batches {removed[0]}..{removed[-1]}" if removed else "nothing to remove")
    print(f"the next run continues after batch {args.to_batch}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headrace", description="Streams to the lakehouse, with Spark's semantics.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    from headrace._cli_authors import add_commands, add_connectors_options

    conn = sub.add_parser("connectors", help="list installed connectors")
    conn.set_defaults(fn=_connectors)
    add_connectors_options(conn)
    add_commands(sub)
    d = sub.add_parser("describe", help="show a connector's options")
    d.add_argument("name")
    d.set_defaults(fn=_describe)
    r = sub.add_parser("run", help="run a pipeline TOML file, printing progress per batch")
    r.add_argument("pipeline")
    r.add_argument("--json", action="store_true", help="print each progress report as JSON")
    r.set_defaults(fn=_run)
    v = sub.add_parser("validate", help="check a pipeline TOML file's options without running it")
    v.add_argument("pipeline")
    v.set_defaults(fn=_validate)
    c = sub.add_parser("checkpoint", help="inspect or roll back a checkpoint")
    csub = c.add_subparsers(dest="action", required=True)
    s = csub.add_parser("show", help="summary of a checkpoint folder")
    s.add_argument("dir")
    rs = csub.add_parser("reset", help="forget batches after N (they are read again on the next run)")
    rs.add_argument("dir")
    rs.add_argument("--to-batch", type=int, required=True, help="the last batch to keep (-1: forget all)")
    c.set_defaults(fn=_checkpoint)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.fn(args))
    except HeadraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``headrace checkpoint show DIR`` and ``headrace checkpoint reset DIR --to-batch N``."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from headrace.errors import HeadraceError

__all__ = ["register"]


def _checkpoint(args: argparse.Namespace) -> int:
    from headrace.checkpoint import Checkpoint

    if not os.path.isfile(os.path.join(args.dir, "metadata")):
        if any(os.path.isdir(os.path.join(args.dir, f)) and os.listdir(os.path.join(args.dir, f))
               for f in ("offsets", "commits")):  # fmt: skip
            raise HeadraceError(
                f"checkpoint {args.dir} has batches but its metadata file is missing (the query id is lost); "
                "restore it from a backup, or start over with a new checkpointLocation"
            )
        raise HeadraceError(f"{args.dir} is not a headrace checkpoint (no metadata file); give the checkpointLocation folder")
    cp = Checkpoint(args.dir)
    if args.action == "show":
        from headrace.history import query_state, read_history

        shown = cp.describe()
        shown["lastRun"] = query_state(args.dir)
        shown["recentProgress"] = read_history(args.dir, limit=args.progress)
        print(json.dumps(shown, indent=2, default=str))
        return 0
    removed = cp.reset_to(args.to_batch, force=args.force)
    if not removed:
        print("nothing to roll back")
    elif args.force:
        print(f"forgot batches {removed[0]}..{removed[-1]}; the next run plans new batches after batch {args.to_batch}")
    else:
        print(f"rolled back batches {removed[0]}..{removed[-1]}; the next run replays each with exactly its recorded "
              "range and batch id (a sink that already holds one skips it and reports its rows as skipped)")  # fmt: skip
    return 0


def register(sub: Any) -> None:
    """Add ``checkpoint show`` / ``checkpoint reset`` to the ``headrace`` parser's subcommands."""
    c = sub.add_parser("checkpoint", help="inspect or roll back a checkpoint")
    csub = c.add_subparsers(dest="action", required=True)
    s = csub.add_parser("show", help="summary of a checkpoint folder")
    s.add_argument("dir")
    s.add_argument("--progress", type=int, default=20, metavar="N",
                   help="include the last N progress records kept with the checkpoint (default 20)")
    rs = csub.add_parser("reset", help="roll back to batch N: later batches are replayed with their recorded ranges")
    rs.add_argument("dir")
    rs.add_argument("--to-batch", type=int, required=True, help="the last batch to keep (-1: back to the start)")
    rs.add_argument("--force", action="store_true",
                    help="forget the batches' recorded ranges too and re-plan them (needed when they are no longer "
                         "recorded; a time-driven source then reads other ranges and rows can be lost)")  # fmt: skip
    c.set_defaults(fn=_checkpoint)

"""``headrace checkpoint show DIR`` and ``headrace checkpoint reset DIR --to-batch N``."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from headrace.errors import CheckpointError, HeadraceError

__all__ = ["register"]


_LAYOUT_FIX = "restore the checkpoint from a backup, or start over with a new checkpointLocation"


def _check_folder(d: str) -> None:
    """``d`` is a checkpoint folder whose metadata is a file (before anything is read)."""
    if not os.path.exists(d):
        raise HeadraceError(f"checkpoint folder {d} does not exist; give the query's checkpointLocation folder")
    if not os.path.isdir(d):
        raise HeadraceError(f"{d} is a file, not a checkpoint folder; give the query's checkpointLocation folder")
    meta = os.path.join(d, "metadata")
    if not os.path.lexists(meta):
        if any(os.path.isdir(os.path.join(d, f)) and os.listdir(os.path.join(d, f)) for f in ("offsets", "commits")):
            raise HeadraceError(
                f"checkpoint {d} has batches but its metadata file is missing (the query id is lost); "
                "restore it from a backup, or start over with a new checkpointLocation"
            )
        raise HeadraceError(f"{d} is not a headrace checkpoint (no metadata file); give the checkpointLocation folder")
    if not os.path.isfile(meta):
        raise CheckpointError(f"checkpoint {d} is damaged: {meta} is not a file; {_LAYOUT_FIX}")


def _check_log_folders(d: str) -> None:
    """The offsets and commits logs a reset rewrites are folders of entry files (before any is removed)."""
    for folder in ("offsets", "commits"):
        path = os.path.join(d, folder)
        if not os.path.lexists(path):
            raise CheckpointError(f"checkpoint {d} is damaged: its {folder} folder ({path}) is missing; {_LAYOUT_FIX}")
        if not os.path.isdir(path):
            raise CheckpointError(f"checkpoint {d} is damaged: {path} is not a folder; {_LAYOUT_FIX}")
        for name in sorted(os.listdir(path)):
            if name.isdigit() and not os.path.isfile(os.path.join(path, name)):
                raise CheckpointError(f"checkpoint {d} is damaged: {os.path.join(path, name)} is not a file "
                                      f"(each batch's entry is one); {_LAYOUT_FIX}")  # fmt: skip


def _damaged(d: str, e: OSError) -> CheckpointError:
    what = {
        "IsADirectoryError": "is a folder where an entry file must be",
        "NotADirectoryError": "is a file where a folder must be",
        "FileNotFoundError": "is missing",
        "PermissionError": "may not be read or written by this process",
    }.get(type(e).__name__, f"cannot be used ({e.strerror or type(e).__name__})")
    return CheckpointError(f"checkpoint {d} is damaged: {e.filename or d} {what}; {_LAYOUT_FIX}")


def _checkpoint(args: argparse.Namespace) -> int:
    from headrace.checkpoint import Checkpoint

    if args.action == "reset" and args.to_batch < -1:
        raise HeadraceError(f"--to-batch {args.to_batch} is not a batch; give the last batch to keep (0, 1, ...), "
                            "or -1 to roll back to the start")  # fmt: skip
    if args.action == "show" and args.progress < 0:
        raise HeadraceError(f"--progress {args.progress} is not a number of records; give 0 or more")
    _check_folder(args.dir)
    cp = Checkpoint(args.dir)
    try:
        if args.action == "show":
            from headrace.history import query_state, read_history

            shown = cp.describe()
            shown["lastRun"] = query_state(args.dir)
            shown["recentProgress"] = read_history(args.dir, limit=args.progress)
            print(json.dumps(shown, indent=2, default=str))
            return 0
        _check_log_folders(args.dir)
        removed = cp.reset_to(args.to_batch, force=args.force)
    except OSError as e:
        raise _damaged(args.dir, e) from None
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

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
        raise HeadraceError(f"{args.dir} is not a headrace checkpoint (no metadata file); give the checkpointLocation folder")
    cp = Checkpoint(args.dir)
    if args.action == "show":
        print(json.dumps(cp.describe(), indent=2, default=str))
        return 0
    removed = cp.reset_to(args.to_batch)
    print(f"removed batches {removed[0]}..{removed[-1]}" if removed else "nothing to remove")
    print(f"the next run continues after batch {args.to_batch}")
    return 0


def register(sub: Any) -> None:
    """Add ``checkpoint show`` / ``checkpoint reset`` to the ``headrace`` parser's subcommands."""
    c = sub.add_parser("checkpoint", help="inspect or roll back a checkpoint")
    csub = c.add_subparsers(dest="action", required=True)
    s = csub.add_parser("show", help="summary of a checkpoint folder")
    s.add_argument("dir")
    rs = csub.add_parser("reset", help="forget batches after N (they are read again on the next run)")
    rs.add_argument("dir")
    rs.add_argument("--to-batch", type=int, required=True, help="the last batch to keep (-1: forget all)")
    c.set_defaults(fn=_checkpoint)

"""``headrace checkpoint show DIR`` and ``headrace checkpoint reset DIR --to-batch N``."""

from __future__ import annotations

import argparse
import contextlib
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
    spark = _spark_layout(d)
    if spark is not None:
        raise CheckpointError(
            f"checkpoint {d} is Apache Spark's, not headrace's ({spark}): a query started on Spark "
            "(start(..., engine=spark)) keeps Spark's own checkpoint, which headrace cannot read or roll back; "
            "inspect it with Spark (spark.streams, the query's lastProgress), or give a headrace checkpointLocation"
        )


def _spark_layout(d: str) -> str | None:
    """What shows ``d`` is a Spark checkpoint (Spark's ``metadata`` holds only ``{"id": ...}``,
    headrace's also ``version`` and ``sources``; Spark's offsets entries start with a ``v1``
    line, headrace's are one JSON document), or None. Reads at most two small files."""
    try:
        with open(os.path.join(d, "metadata"), "rb") as f:
            meta = json.loads(f.read(1 << 16) or b"null")
    except (OSError, ValueError):
        meta = None
    if isinstance(meta, dict) and "id" in meta and "version" not in meta and "sources" not in meta:
        return 'its metadata file holds only {"id": ...}'
    offsets = os.path.join(d, "offsets")
    with contextlib.suppress(OSError):
        first = min((n for n in os.listdir(offsets) if n.isdigit()), key=int, default=None)
        if first is not None:
            with open(os.path.join(offsets, first), "rb") as f:
                if f.readline().strip() == b"v1":
                    return f"{os.path.join(offsets, first)} starts with Spark's 'v1' line"
    return None


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


_SHORT = 100  # characters of an offset shown in the summary


def _short(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), default=str)
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."


def _bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} GiB"


def _folder_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def _when(ms: Any) -> str:
    import datetime as dt

    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return "?"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _summary(d: str, shown: dict[str, Any]) -> str:
    """``checkpoint show`` for people: query, batches, last run, sources with their offsets in
    short, state operators and their sizes, sink. ``--json`` prints everything behind it."""
    from headrace._words import counted
    from headrace.cli import wrap

    meta = shown.get("metadata") or {}
    lines = [f"checkpoint {shown.get('location', d)}"]
    name = meta.get("name")
    lines.append(f"  query:          {name + ' ' if name else ''}(id {meta.get('id', '?')})")
    n = int(shown.get("batches") or 0)
    if n:
        batches = f"{counted(n, 'batch')} ({shown.get('firstBatch')}..{shown.get('lastBatch')})"
        committed = shown.get("lastCommitted")
        batches += f"; last committed {committed}" if committed is not None else "; none committed"
        replay = shown.get("batchesToReplay") or []
        if replay:
            batches += f"; {_batch_ids(replay)} replayed on the next run"
    else:
        batches = "none yet"
    lines.append(f"  batches:        {batches}")
    run = shown.get("lastRun") or {}
    if run:
        status = str(run.get("status", "?"))
        text = f"{status}, started {_when(run.get('startedAt'))}"
        if run.get("endedAt"):
            text += f", ended {_when(run.get('endedAt'))}"
        lines.append(f"  last run:       {text}")
        if run.get("exception"):
            lines += wrap(f"error: {str(run['exception']).splitlines()[0]}", indent="    ", hang="      ")
    progress = (shown.get("recentProgress") or [{}])[-1] or {}
    offsets = shown.get("lastOffsets") or []
    sources = meta.get("sources") or []
    lines.append("  sources:")
    for i, src in enumerate(sources or [{}] * len(offsets)):
        where = f" {src['path']}" if isinstance(src, dict) and src.get("path") else ""
        lines.append(f"    {i}: {src.get('connector', '?') if isinstance(src, dict) else '?'}{where}")
        if i < len(offsets):
            lines.append(f"       last batch {_short(offsets[i].get('start'))} -> {_short(offsets[i].get('end'))}")
    operators = progress.get("stateOperators") or []
    state_root = os.path.join(d, "state")
    on_disk = sorted(os.listdir(state_root)) if os.path.isdir(state_root) else []
    if operators or on_disk:
        lines.append("  state:")
        for i, op in enumerate(operators):
            parts = [str(op.get("operatorName", f"operator {i}"))]
            if isinstance(op.get("numRowsTotal"), int):
                parts.append(counted(op["numRowsTotal"], "row"))
            if isinstance(op.get("memoryUsedBytes"), int | float):
                parts.append(f"{_bytes(op['memoryUsedBytes'])} in memory")
            lines.append(f"    {i}: " + ", ".join(parts))
        folders = [f for f in on_disk if os.path.isdir(os.path.join(state_root, f))]
        if folders:
            sizes = ", ".join(f"state/{f} {_bytes(_folder_bytes(os.path.join(state_root, f)))}" for f in folders)
            lines.append(f"    on disk: {sizes}")
    sink = meta.get("sink") or {}
    if sink:
        lines.append(f"  sink:           {sink.get('connector', '?')}" + (f" {sink['path']}" if sink.get("path") else ""))
    lines.append("(--json: everything, with the last progress records)")
    return "\n".join(lines)


def _batch_ids(ids: list[int]) -> str:
    """``batch 3`` or ``batches 3..5`` (or a list when they are not consecutive)."""
    if len(ids) == 1:
        return f"batch {ids[0]}"
    if ids == list(range(ids[0], ids[-1] + 1)):
        return f"batches {ids[0]}..{ids[-1]}"
    return "batches " + ", ".join(map(str, ids))


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
            shown["recentProgress"] = read_history(args.dir, limit=args.progress if args.json else max(1, args.progress))
            print(json.dumps(shown, indent=2, default=str) if args.json else _summary(args.dir, shown))
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
    s.add_argument("--json", action="store_true",
                   help="print everything as JSON, with the last progress records (default: a summary)")
    s.add_argument("--progress", type=int, default=20, metavar="N",
                   help="with --json, include the last N progress records kept with the checkpoint (default 20)")
    rs = csub.add_parser("reset", help="roll back to batch N: later batches are replayed with their recorded ranges")
    rs.add_argument("dir")
    rs.add_argument("--to-batch", type=int, required=True, help="the last batch to keep (-1: back to the start)")
    rs.add_argument("--force", action="store_true",
                    help="forget the batches' recorded ranges too and re-plan them (needed when they are no longer "
                         "recorded; a time-driven source then reads other ranges and rows can be lost)")  # fmt: skip
    c.set_defaults(fn=_checkpoint)

"""Rolling a checkpoint back (``headrace checkpoint reset``) and summing it up
(``headrace checkpoint show``)."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

from headrace.errors import CheckpointError

if TYPE_CHECKING:
    from headrace.checkpoint.store import Checkpoint

__all__ = ["describe", "reset_to"]


def reset_to(cp: Checkpoint, batch_id: int, *, force: bool = False) -> list[int]:
    """Roll the query back to just after batch ``batch_id`` (``-1``: to the start). Returns
    the batch ids rolled back. Refuses while a query holds the lock.

    By default the rolled-back batches keep their offsets entries and lose only their
    commits entries: the next run replays each of them with exactly its recorded range and
    batch id, so a sink that skips batch ids it has already committed skips exactly the rows
    it already holds, and one whose output was rolled back (a Delta table restored to an
    older version) gets them again. Nothing is lost, even from a time-driven source such as
    ``rate`` whose re-planned ranges would differ. When a recorded range is no longer there
    (only the last ``retain`` batches are kept), the reset is refused, unless ``force``:
    then the batches are forgotten entirely and re-planned on the next run (new ranges; a
    sink keyed by batch id may skip them as already committed, losing those rows).
    """
    cp._lock()
    try:
        ids = cp.batch_ids()
        if batch_id >= 0 and batch_id not in ids:
            raise CheckpointError(
                f"checkpoint {cp.location} has no batch {batch_id}; batches kept: "
                f"{[*ids[:1], '...', *ids[-1:]] if ids else 'none'}"
            )
        removed = sorted({i for i in ids + cp.committed_ids() if i > batch_id})
        kept = [i for i in ids if i > batch_id]
        if not force and kept and kept != list(range(batch_id + 1, kept[-1] + 1)):
            raise CheckpointError(
                f"checkpoint {cp.location}: cannot roll back to batch {batch_id} safely: the ranges of batches "
                f"{batch_id + 1}..{kept[0] - 1} are no longer recorded (only the last {cp.retain} batches are "
                "kept), so they cannot be replayed exactly. Fix: roll back to a batch from "
                f"{kept[0] - 1 if kept[0] > 0 else 0} on, or add --force to re-plan them (a time-driven source "
                "such as rate then reads other ranges, and a sink that skips committed batch ids skips them: "
                "rows can be lost), or start over with a new checkpointLocation"
            )
        for i in removed:
            folders = ("commits", "offsets") if force else ("commits",)
            for folder in folders:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(cp._p(folder, str(i)))
        return removed
    finally:
        cp.close()

def describe(cp: Checkpoint) -> dict[str, Any]:
    """A summary for ``headrace checkpoint show``."""
    meta = cp._read_json(cp._p("metadata")) or {}
    ids = cp.batch_ids() if os.path.isdir(cp._p("offsets")) else []
    committed = set(cp.committed_ids()) if os.path.isdir(cp._p("commits")) else set()
    last = cp.read_offsets(ids[-1]) if ids else None
    return {
        "location": cp.location,
        "metadata": meta,
        "batches": len(ids),
        "firstBatch": ids[0] if ids else None,
        "lastBatch": ids[-1] if ids else None,
        "lastCommitted": max(committed) if committed else None,
        "pendingReplay": bool(ids) and ids[-1] not in committed,
        "batchesToReplay": [i for i in ids if i > max(committed, default=-1)],
        "lastOffsets": (
            [{"start": s, "end": e} for s, e in zip(last.starts, last.ends, strict=True)] if last else None
        ),
    }

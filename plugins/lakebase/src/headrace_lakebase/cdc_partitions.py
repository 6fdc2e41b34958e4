"""The change source's partitions: a key range of the initial snapshot, an LSN range of the
stream, how a batch's offsets map to them, and where the stream's batch ends (after the last
whole transaction). Pure functions and picklable dataclasses: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from headrace.protocols import Offset, Partition

__all__ = ["SnapshotPartition", "StreamPartition", "key_tuple", "plan_partitions", "stream_end"]


@dataclass(frozen=True)
class StreamPartition(Partition):
    """Transactions whose commit starts in ``[start, end)``; ``snap`` the snapshot to skip."""

    start: int
    end: int
    snap: dict[str, Any] | None


@dataclass(frozen=True)
class SnapshotPartition(Partition):
    """Snapshot rows with ``after < key <= upto``; ``snap_text`` names the snapshot they were
    planned in (read in it when it is still open)."""

    after: tuple[str, ...] | None
    upto: tuple[str, ...] | None
    snap_text: str
    time_us: int = 0
    final: bool = False  # the snapshot's last range: its snapshot is released after it
    empty: bool = False  # nothing was left in the snapshot after ``after``


def plan_partitions(start: Offset, end: Offset) -> list[Partition]:
    """The partitions of the batch ``[start, end)``: a key range of the snapshot and/or an LSN
    range of changes. Called by ``LakebaseChangeSource.partitions``, once per batch."""
    if start == end:
        return []
    parts: list[Partition] = []
    if start["phase"] == "snapshot":
        snap = end.get("snap") or start.get("snap") or {}
        final = end["phase"] != "snapshot"
        if not final:
            upto, empty = end.get("after"), False
        elif "last" in end:  # the last range ends at the snapshot's last key, recorded with the offset
            upto = end["last"] if end["last"] is not None else end.get("after")
            empty = upto is None  # an empty table
        else:  # an offset written before "last" existed: read to the end of the table
            upto, empty = None, False
        first = start.get("snap") or {}
        parts.append(SnapshotPartition(key_tuple(start.get("after")), key_tuple(upto), str(snap.get("text", "")),
                                       int(first.get("time", 0)), final=final, empty=empty))  # fmt: skip
    if end["phase"] == "stream" and int(end["lsn"]) > int(start["lsn"]):
        parts.append(StreamPartition(int(start["lsn"]), int(end["lsn"]), start.get("snap")))
    return parts


def stream_end(rows: Sequence[tuple[int, bytes]], pos: int, mark: int | None) -> int:
    """The end of the last whole transaction among the peeked pgoutput messages ``rows``
    (transactions committed before ``pos`` skipped), stopping before a transaction that commits
    at or after the available-now ``mark``; ``pos`` when there is none."""
    end = pos
    in_tx = False
    for _lsn, data in rows:
        tag = data[0]
        if tag == 66:  # Begin: Int64 final (commit) LSN
            final = int.from_bytes(data[1:9], "big")
            if mark is not None and final >= mark:
                break
            in_tx = final >= pos
        elif tag == 67 and in_tx:  # Commit: Int8 flags, Int64 commit LSN, Int64 end LSN, Int64 time
            end = int.from_bytes(data[10:18], "big")
            in_tx = False
    return end


def key_tuple(v: Any) -> tuple[str, ...] | None:
    """A snapshot key from an offset (a JSON list) as a tuple of texts; None stays None."""
    return None if v is None else tuple(str(x) for x in v)

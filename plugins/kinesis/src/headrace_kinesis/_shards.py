"""The source's offset and the shard lineage rules, as pure functions (no I/O).

Offset (a JSON dict)::

    {"v": 1, "stream": "orders", "after": "shardId-000000000003" | None,
     "shards": {"shardId-000000000004": {"seq": "4968...", "ts": 1717000000000, "done": false,
                                         "parents": ["shardId-000000000001"]}, ...}}

Per shard, the position is *after* ``seq`` (the last sequence number read; ``ts`` is its arrival
time in epoch ms); without ``seq`` it is ``at`` (epoch ms: AT_TIMESTAMP, from
``initialPosition=latest/at_timestamp``) or else the start of the shard (TRIM_HORIZON). ``done``
marks a closed shard read to its end. Finished shards are dropped once every shard with a
smaller id is finished too: ``after`` then moves up to them, and the shard listing starts after
it (shard ids grow with each split or merge, so a child's id is always above its parents').
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from headrace.protocols import Offset

__all__ = ["Position", "add_listed", "compact", "eligible", "new_offset", "position", "shard_sort_key"]

Position = tuple[str, ...]


def shard_sort_key(shard_id: str) -> tuple[int, str]:
    """Shard ids sort by their number (``shardId-000000000012`` -> 12)."""
    tail = shard_id.rsplit("-", 1)[-1]
    return (int(tail), shard_id) if tail.isdigit() else (1 << 62, shard_id)


def new_offset(stream: str) -> Offset:
    return {"v": 1, "stream": stream, "after": None, "shards": {}}


def position(state: Mapping[str, Any]) -> Position:
    """Where reading a shard resumes: ``("after", seq)``, ``("at", ms)`` or ``("start",)``."""
    if state.get("seq"):
        return ("after", str(state["seq"]))
    if state.get("at") is not None:
        return ("at", str(int(state["at"])))
    return ("start",)


def _parents(shard: Mapping[str, Any]) -> list[str]:
    return [p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p]


def add_listed(offset: Offset, listed: Iterable[Mapping[str, Any]], *, initial: Mapping[str, Any] | None = None,
               closed_done: bool = False) -> Offset:
    """A copy of ``offset`` with the listed shards it does not know yet added.

    New shards start at ``initial`` (default: the start of the shard). With ``closed_done``
    (``initialPosition=latest`` at the very start), shards that are already closed are added as
    finished: their records are all before "latest".
    """
    out = copy.deepcopy(offset)
    after = out.get("after")
    shards: dict[str, Any] = out["shards"]
    for s in listed:
        sid = s["ShardId"]
        if sid in shards or (after is not None and shard_sort_key(sid) <= shard_sort_key(after)):
            continue
        closed = s.get("SequenceNumberRange", {}).get("EndingSequenceNumber") is not None
        state: dict[str, Any] = {"seq": None, "done": bool(closed and closed_done), "parents": _parents(s)}
        if initial and not state["done"]:
            state.update(initial)
        shards[sid] = state
    out["shards"] = dict(sorted(shards.items(), key=lambda kv: shard_sort_key(kv[0])))
    return out


def _finished(offset: Offset, sid: str) -> bool:
    after = offset.get("after")
    if after is not None and shard_sort_key(sid) <= shard_sort_key(after):
        return True
    state = offset["shards"].get(sid)
    # A parent never seen (expired past retention, or closed before the query began) holds nothing to read.
    return True if state is None else bool(state.get("done"))


def eligible(offset: Offset) -> list[str]:
    """Shards to read from ``offset``: not finished, and every parent finished (parent before child)."""
    return [
        sid for sid, st in offset["shards"].items()
        if not st.get("done") and all(_finished(offset, p) for p in st.get("parents", ()))
    ]  # fmt: skip


def compact(offset: Offset) -> Offset:
    """Drop finished shards from the front (lowest ids), moving ``after`` up to them.

    A finished shard is kept while a shard with a smaller id is unfinished, so that the
    listing (which starts after ``after``) never shows a dropped shard as new.
    """
    out = copy.deepcopy(offset)
    shards: dict[str, Any] = out["shards"]
    for sid in sorted(shards, key=shard_sort_key):
        if not shards[sid].get("done"):
            break
        out["after"] = sid
        del shards[sid]
    return out

"""Which queries the dashboard knows: checkpoint folders given or found under folders given.

No third-party import: the CLI and the tests use it without the ``ui`` extra.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from typing import Any

from headrace.history import query_state, read_history

__all__ = ["Catalog", "find_checkpoints"]

_MAX_DEPTH = 4
_SKIP = {".git", ".venv", "node_modules", "__pycache__", "_delta_log", "sources", "sinks", "offsets", "commits", "progress"}


def _is_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "metadata")) and os.path.isdir(os.path.join(path, "offsets"))


def find_checkpoints(root: str, max_depth: int = _MAX_DEPTH) -> list[str]:
    """``root`` itself when it is a checkpoint, else the checkpoints under it (at most
    ``max_depth`` folders down, not looking inside a checkpoint), sorted."""
    root = os.path.abspath(root)
    if _is_checkpoint(root):
        return [root]
    found = []
    base_depth = root.rstrip(os.sep).count(os.sep)
    for dirpath, dirnames, _ in os.walk(root):
        if _is_checkpoint(dirpath):
            found.append(dirpath)
            dirnames[:] = []
            continue
        if dirpath.count(os.sep) - base_depth >= max_depth:
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP and not d.startswith("."))
    return sorted(found)


def _key(path: str) -> str:
    return hashlib.sha1(path.encode()).hexdigest()[:12]


class Catalog:
    """The folders the dashboard watches, rescanned on each listing (new checkpoints appear)."""

    def __init__(self, roots: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._roots: list[str] = []
        for r in roots:
            self.add(r)

    def add(self, root: str) -> None:
        """Watch a checkpoint, or every checkpoint under a folder. Thread-safe."""
        root = os.path.abspath(root)
        with self._lock:
            if root not in self._roots:
                self._roots.append(root)

    def checkpoints(self) -> dict[str, str]:
        """``{key: checkpoint path}`` of every known checkpoint."""
        with self._lock:
            roots = list(self._roots)
        out: dict[str, str] = {}
        for r in roots:
            for cp in find_checkpoints(r) if os.path.isdir(r) else []:
                out.setdefault(_key(cp), cp)
        return out

    def queries(self) -> list[dict[str, Any]]:
        """One summary per known query: state (``query_state``) and its last progress record."""
        out = []
        for key, cp in self.checkpoints().items():
            state = query_state(cp)
            last = read_history(cp, limit=1)
            state["key"] = key
            state["lastProgress"] = last[0] if last else None
            out.append(state)
        order = {"running": 0, "failed": 1, "killed": 2, "finished": 3, "unknown": 4}
        out.sort(key=lambda s: (order.get(s["status"], 9), s["name"] or "", s["checkpoint"]))
        return out

    def progress(self, key: str, after: int | None = None, limit: int = 1000) -> dict[str, Any] | None:
        """A query's state and its progress records after batch ``after``; None for an unknown key."""
        cp = self.checkpoints().get(key)
        if cp is None:
            return None
        state = query_state(cp)
        state["key"] = key
        return {"state": state, "progress": read_history(cp, after=after, limit=limit)}

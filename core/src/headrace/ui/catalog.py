"""Which queries and pipelines the dashboard knows: checkpoint folders given or found under
folders given, and pipeline storage folders (``event_log/events.jsonl``) found the same way.

No third-party import: the CLI and the tests use it without the ``ui`` extra.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from typing import Any

from headrace.history import query_state, read_history

__all__ = ["Catalog", "find_checkpoints", "find_pipelines", "pipeline_summary"]

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


def _is_pipeline(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "event_log", "events.jsonl"))


def find_pipelines(root: str, max_depth: int = _MAX_DEPTH) -> list[str]:
    """The pipeline storage folders (those with ``event_log/events.jsonl``) at or under
    ``root`` (at most ``max_depth`` folders down, not inside a checkpoint), sorted."""
    root = os.path.abspath(root)
    found = []
    base_depth = root.rstrip(os.sep).count(os.sep)
    for dirpath, dirnames, _ in os.walk(root):
        if _is_pipeline(dirpath):
            found.append(dirpath)
        if _is_checkpoint(dirpath) or dirpath.count(os.sep) - base_depth >= max_depth:
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP and not d.startswith("."))
    return sorted(found)


def _num(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def pipeline_summary(storage: str) -> dict[str, Any]:
    """What a pipeline's event log says about its last run: ``name``, ``updateId``,
    ``state`` and when, the flow graph's DOT (``graphDot``), and per flow its dataset, status,
    error, batches, output rows, dropped rows and expectations (passed and failed records
    over the run), and the ``checkpoint`` of its query."""
    from headrace.pipelines.events import read_events

    events = list(read_events(os.path.join(storage, "event_log", "events.jsonl")))
    updates = [e for e in events if e.get("event_type") == "create_update"]
    update_id = ((updates[-1].get("origin") or {}).get("update_id")) if updates else None
    run = [e for e in events if (e.get("origin") or {}).get("update_id") == update_id] if update_id else events
    out: dict[str, Any] = {"storage": storage, "name": "", "updateId": update_id, "state": None,
                           "timestamp": None, "graphDot": None, "flows": []}  # fmt: skip
    flows: dict[str, dict[str, Any]] = {}
    for e in run:
        origin = e.get("origin") or {}
        out["name"] = origin.get("pipeline_name") or out["name"]
        det = (e.get("details") or {}).get(e.get("event_type")) or {}
        if not isinstance(det, dict):
            continue
        if e.get("event_type") == "update_progress":
            out["state"], out["timestamp"] = det.get("state"), e.get("timestamp")
            out["graphDot"] = det.get("graph_dot") or out["graphDot"]
        elif e.get("event_type") == "flow_progress" and origin.get("flow_name"):
            f = flows.setdefault(origin["flow_name"], {
                "name": origin["flow_name"], "dataset": origin.get("dataset_name"), "status": None, "error": None,
                "batches": 0, "outputRows": 0, "droppedRecords": 0, "expectations": {}, "checkpoint": None})  # fmt: skip
            f["status"] = det.get("status") or f["status"]
            f["error"] = det.get("error") or (None if det.get("status") != "FAILED" else f["error"])
            metrics = det.get("metrics") or {}
            if isinstance(metrics, dict) and "batch_id" in metrics:
                f["batches"] += 1
                f["outputRows"] += _num(metrics.get("num_output_rows"))
            dq = det.get("data_quality") or {}
            if isinstance(dq, dict):
                f["droppedRecords"] += _num(dq.get("dropped_records"))
                for x in dq.get("expectations") or []:
                    if isinstance(x, dict) and x.get("name"):
                        got = f["expectations"].setdefault(x["name"], {"name": x["name"], "passed": 0, "failed": 0})
                        got["passed"] += _num(x.get("passed_records"))
                        got["failed"] += _num(x.get("failed_records"))
    for f in flows.values():
        f["expectations"] = list(f["expectations"].values())
        cp = os.path.join(storage, "checkpoints", f["dataset"] or "", f["name"])
        f["checkpoint"] = cp if f["dataset"] and _is_checkpoint(cp) else None
    out["flows"] = sorted(flows.values(), key=lambda f: (f["dataset"] or "", f["name"]))
    return out


def _key(path: str) -> str:
    return hashlib.sha1(path.encode()).hexdigest()[:12]


class Catalog:
    """The folders the dashboard watches, rescanned on each listing (new checkpoints appear)."""

    def __init__(self, roots: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._roots: list[str] = []
        # a pipeline's summary, kept while its event log is unchanged (it is read whole)
        self._summaries: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}
        for r in roots:
            self.add(r)

    def add(self, root: str) -> None:
        """Watch a checkpoint, or every checkpoint under a folder. Thread-safe."""
        root = os.path.abspath(root)
        with self._lock:
            if root not in self._roots:
                self._roots.append(root)

    def checkpoints(self) -> dict[str, str]:
        """``{key: checkpoint path}`` of every known checkpoint (those of pipelines' flows too)."""
        with self._lock:
            roots = list(self._roots)
        out: dict[str, str] = {}
        for r in roots:
            if not os.path.isdir(r):
                continue
            found = find_checkpoints(r)
            for p in find_pipelines(r):  # a pipeline's flows, however deep its storage is
                found += find_checkpoints(os.path.join(p, "checkpoints"))
            for cp in found:
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

    def pipeline_folders(self) -> dict[str, str]:
        """``{key: storage folder}`` of every known pipeline."""
        with self._lock:
            roots = list(self._roots)
        out: dict[str, str] = {}
        for r in roots:
            for p in find_pipelines(r) if os.path.isdir(r) else []:
                out.setdefault(_key(p), p)
        return out

    def pipelines(self) -> list[dict[str, Any]]:
        """One summary per known pipeline (:func:`pipeline_summary`), each flow with the
        dashboard key of its query. Called by the dashboard on every poll."""
        keys = {cp: k for k, cp in self.checkpoints().items()}
        out = []
        for key, folder in self.pipeline_folders().items():
            summary = dict(self._summary(folder))
            summary["key"] = key
            summary["hasGraph"] = bool(summary.pop("graphDot"))
            summary["flows"] = [{**f, "queryKey": keys.get(f["checkpoint"]) if f["checkpoint"] else None}
                                for f in summary["flows"]]  # fmt: skip
            out.append(summary)
        out.sort(key=lambda p: (p["name"], p["storage"]))
        return out

    def pipeline_graph(self, key: str) -> str | None:
        """The DOT of a pipeline's flow graph (its last run's); None if unknown or absent."""
        folder = self.pipeline_folders().get(key)
        return self._summary(folder)["graphDot"] if folder else None

    def _summary(self, folder: str) -> dict[str, Any]:
        try:
            st = os.stat(os.path.join(folder, "event_log", "events.jsonl"))
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = (0, -1)
        with self._lock:
            got = self._summaries.get(folder)
        if got is not None and got[0] == stamp:
            return got[1]
        summary = pipeline_summary(folder)
        with self._lock:
            self._summaries[folder] = (stamp, summary)
        return summary

    def progress(self, key: str, after: int | None = None, limit: int = 1000) -> dict[str, Any] | None:
        """A query's state and its progress records after batch ``after``; None for an unknown key."""
        cp = self.checkpoints().get(key)
        if cp is None:
            return None
        state = query_state(cp)
        state["key"] = key
        return {"state": state, "progress": read_history(cp, after=after, limit=limit)}

"""Shared helpers of the Spark adapter: option normalisation, ids, paths."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

from headrace.options import OptionSchema

FORMAT_PREFIX = "headrace."
STATE_PATH_OPTION = "headraceStatePath"
# Reader option: at most this many Spark tasks per micro-batch (0: one per headrace partition).
MAX_TASKS_OPTION = "headraceMaxTasks"
# Options Spark adds to a writer's options (DataStreamWriter.option / queryName), consumed here.
SPARK_WRITER_OPTIONS = ("checkpointLocation", "queryName")


def canonical_options(raw: Mapping[str, Any], schema: OptionSchema, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """Spark lower-cases option names; give declared options their declared spelling back (so
    errors and ``Options.redacted()`` read like the user's code) and drop engine options.

    Pass-through options keep the lower-cased key Spark gives (``kafka.bootstrap.servers``):
    Spark does not keep the original case, so a client library that needs mixed-case keys
    cannot get them through Spark.
    """
    dropped = {d.lower() for d in drop}
    out: dict[str, str] = {}
    for key, value in raw.items():
        low = key.lower()
        if low in dropped:
            continue
        opt = schema.get(low)
        if opt is not None:
            name = opt.name if low == opt.name.lower() else next((a for a in opt.aliases if a.lower() == low), opt.name)
            out[name] = value
            continue
        pt = next((p for p in schema.passthrough if low.startswith(p.prefix.lower())), None)
        out[pt.prefix + key[len(pt.prefix):] if pt is not None else key] = value
    return out


def get_option(raw: Mapping[str, Any], name: str) -> Any:
    """``raw[name]`` looked up case-insensitively, or None."""
    low = name.lower()
    return next((v for k, v in raw.items() if k.lower() == low), None)


def local_path(location: str) -> str | None:
    """The local filesystem path of ``location`` (a plain path or ``file:`` URI), else None."""
    if location.startswith("file://"):
        return os.path.abspath(location[len("file://"):])
    if location.startswith("file:"):
        return os.path.abspath(location[len("file:"):])
    if "://" in location:
        return None
    return os.path.abspath(location)


def query_id_from_checkpoint(location: str) -> str:
    """A query id that is the same every time the query restarts from ``location``.

    Spark writes ``<checkpoint>/metadata`` (``{"id": "<query id>"}``) when the query is first
    created, before any batch runs, so its id is used when the file is readable; otherwise
    (remote storage) the id is a UUID derived from the checkpoint location, equally stable.
    """
    path = local_path(location)
    if path is not None:
        try:
            with open(os.path.join(path, "metadata")) as f:
                qid = json.loads(f.readline()).get("id")
            if isinstance(qid, str) and qid:
                return qid
        except (OSError, ValueError):
            pass
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "headrace-spark:" + (path or location).rstrip("/")))

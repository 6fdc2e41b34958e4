"""One policy for bad records, shared by every source that parses data and every sink that can
reject a row.

Options (add ``BAD_RECORD_OPTIONS`` to a connector's schema)::

    badRecordsPolicy        fail (default) | drop | deadLetter
    badRecordsPath          dead-letter folder (deadLetter): <path>/batch=<id>/<origin>.jsonl
    badRecordsSink          ... or a sink connector to write them with (delta, kafka, lakebase...),
    badRecordsSinkOptions   with these options (badRecordsPath is its path)
    maxBadRecords           fail the batch when more bad records than this (drop / deadLetter)
    maxBadRecordsFraction   ... or when more than this fraction of the batch's records (0..1)

A connector builds a :class:`BadRecords` from its options (``BadRecords.from_options``), keeps
it as its ``bad_records`` attribute and reports each bad record with ``add`` while it reads or
writes (``fail`` raises there, naming the record, where it is and the fix). The engine settles
the batch after the sink's ``write`` and before its ``commit``: the thresholds are checked (the
batch fails, nothing is committed), then the dead letters are written as one file per batch
and origin, atomically, under a name made of the batch id. A replay of the batch (after a
crash anywhere) writes the same file again, so every bad record is dead-lettered exactly once,
and only with a batch that is committed or will be replayed. The counts go into the source's
(or sink's) metrics in the progress report: ``numBadRecords``, ``numBadRecordsDropped``,
``numBadRecordsDeadLettered``.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.checkpoint import atomic_write
from headrace.errors import HeadraceError, OptionProblem
from headrace.options import Choice, Float, Integer, Option, Options, OptionSchema, OptionType, Rule, String

__all__ = ["BAD_RECORD_OPTIONS", "DEAD_LETTER_SCHEMA", "BadRecord", "BadRecords", "BadRecordsError", "JsonObject",
           "read_dead_letters"]

# the dead letters handed to a badRecordsSink; ``key`` (the location) and ``value`` (the whole
# dead letter as JSON) are what message sinks such as kafka send
DEAD_LETTER_SCHEMA = pa.schema([("batchId", pa.int64()), ("origin", pa.string()), ("location", pa.string()),
                                ("error", pa.string()), ("record", pa.string()), ("key", pa.string()),
                                ("value", pa.string())])  # fmt: skip

POLICIES = ("fail", "drop", "deadLetter")


class JsonObject(OptionType):
    """A mapping: a dict through the API or TOML, or a JSON object in a string."""

    label = "json object"

    def parse(self, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise ValueError(f"is not a JSON object ({e})") from None
        if not isinstance(value, Mapping):
            raise ValueError(f"{type(value).__name__} is not a mapping of option names to values")
        return dict(value)


def _check(opts: Options) -> list[OptionProblem]:
    problems = []
    policy = opts.get("badRecordsPolicy") or "fail"
    if policy == "deadLetter" and not opts.get("badRecordsPath") and not opts.get("badRecordsSink"):
        problems.append(OptionProblem(
            "badRecordsPath", "is required with badRecordsPolicy=deadLetter (a folder for the dead letters), "
            "unless badRecordsSink names a connector to write them to"))  # fmt: skip
    given = [n for n in ("maxBadRecords", "maxBadRecordsFraction", "badRecordsPath", "badRecordsSink") if opts.is_set(n)]
    if policy == "fail" and given:
        problems.append(OptionProblem(
            "badRecordsPolicy", f"is fail (the default), so {' / '.join(given)} would have no effect; set "
            "badRecordsPolicy to drop or deadLetter"))  # fmt: skip
    if opts.is_set("badRecordsSinkOptions") and not opts.is_set("badRecordsSink"):
        problems.append(OptionProblem("badRecordsSinkOptions", "is only used with badRecordsSink (the connector)"))
    return problems


BAD_RECORD_OPTIONS = OptionSchema(
    [
        Option("badRecordsPolicy", Choice(*POLICIES),
               doc="What a record that cannot be parsed or written does: fail the batch (default), drop it "
                   "(counted in progress), or deadLetter it to badRecordsPath with the error, the origin and where it was."),
        Option("badRecordsPath", String(),
               doc="Dead-letter folder (badRecordsPolicy=deadLetter): one JSON-lines file per batch and origin, "
                   "<path>/batch=<id>/<origin>.jsonl, written exactly once with the batch."),
        Option("badRecordsSink", String(),
               doc="Write the dead letters through this sink connector instead of JSON files (delta, kafka, "
                   "lakebase, files...); badRecordsPath is its path. Exactly once when its commit is idempotent."),
        Option("badRecordsSinkOptions", JsonObject(), secret=True,
               doc="Options of badRecordsSink (a mapping, or a JSON object string), e.g. {\"topic\": \"dlq\", "
                   "\"kafka.bootstrap.servers\": \"...\"}."),
        Option("maxBadRecords", Integer(min=0),
               doc="Fail the batch (and the query) when it has more bad records than this (drop / deadLetter)."),
        Option("maxBadRecordsFraction", Float(min=0.0, max=1.0),
               doc="Fail the batch when more than this fraction (0..1) of its records are bad (drop / deadLetter)."),
    ],
    rules=[Rule("badRecordsPath with deadLetter; thresholds only with drop / deadLetter", _check)],
)  # fmt: skip


class BadRecordsError(HeadraceError):
    """A bad record under ``badRecordsPolicy=fail``, or a batch over its bad-record threshold."""


@dataclass(frozen=True)
class BadRecord:
    """One rejected record: ``location`` (file and record number, topic/partition@offset,
    row of a batch...), ``error`` (why), ``record`` (its text, or its values as JSON)."""

    location: str
    error: str
    record: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"location": self.location, "error": self.error, "record": self.record}


class BadRecords:
    """The policy of one connector instance and the bad records of its current batch.

    ``add`` is thread-safe (partitions are read in parallel). The engine calls ``settle`` once
    per batch. Not picklable on purpose: bad records are collected where the engine runs.
    """

    def __init__(self, policy: str = "fail", *, path: str | None = None, max_records: int | None = None,
                 max_fraction: float | None = None, what: str = "") -> None:  # fmt: skip
        if policy not in POLICIES:
            raise ValueError(f"badRecordsPolicy {policy!r} is not one of {', '.join(POLICIES)}")
        self.policy = policy
        self.path = os.path.abspath(path) if path else None
        self.max_records = max_records
        self.max_fraction = max_fraction
        self.what = what
        self.sink_format: str | None = None
        self.sink_options: dict[str, Any] = {}
        self.sink: Any = None  # the dead-letter sink the engine made from sink_format (Sink protocol)
        self._lock = threading.Lock()
        self._pending: list[BadRecord] = []
        self.last: dict[str, int] = {}
        self.totals = {"numBadRecords": 0, "numBadRecordsDropped": 0, "numBadRecordsDeadLettered": 0}

    @classmethod
    def from_options(cls, options: Mapping[str, Any], what: str = "") -> BadRecords | None:
        """The policy a connector's options ask for, or None when ``badRecordsPolicy`` is not
        set (the connector keeps its own default behaviour, e.g. cloudFiles' rescued data)."""
        policy = options.get("badRecordsPolicy")
        if not policy:
            return None
        out = cls(policy, path=options.get("badRecordsPath"), max_records=options.get("maxBadRecords"),
                  max_fraction=options.get("maxBadRecordsFraction"), what=what)  # fmt: skip
        if policy == "deadLetter" and options.get("badRecordsSink"):
            out.sink_format = str(options.get("badRecordsSink"))
            raw = options.get("badRecordsSinkOptions") or {}
            out.sink_options = dict(raw.reveal() if hasattr(raw, "reveal") else raw)
            if options.get("badRecordsPath"):
                out.sink_options.setdefault("path", options.get("badRecordsPath"))
        return out

    def add(self, records: list[BadRecord]) -> None:
        """Report bad records found while reading or writing. ``fail``: raises at once."""
        if not records:
            return
        if self.policy == "fail":
            r = records[0]
            more = f" (and {len(records) - 1} more)" if len(records) > 1 else ""
            raise BadRecordsError(
                f"{self.what or 'a connector'}: bad record at {r.location}: {r.error}{more}; record: "
                f"{_clip(r.record)}. Fix the data, or set badRecordsPolicy=drop or deadLetter (with badRecordsPath)"
            )
        with self._lock:
            self._pending.extend(records)

    def pending(self) -> int:
        """Bad records reported for the current batch so far."""
        with self._lock:
            return len(self._pending)

    def settle(self, batch_id: int, total_records: int, *, origin: str) -> dict[str, int]:
        """Called by the engine once per batch, after the sink's write and before its commit,
        with the number of good records of the batch (``total_records``): checks the thresholds (raising ``BadRecordsError``), writes the dead letters of the
        batch (one file, replaced on a replay), resets, and returns the batch's counts."""
        with self._lock:
            bad, self._pending = self._pending, []
        n = len(bad)
        total = total_records + n
        if self.max_records is not None and n > self.max_records:
            raise BadRecordsError(
                f"{self.what or origin}: batch {batch_id} has {n} bad records, more than maxBadRecords="
                f"{self.max_records}; first: {bad[0].error} at {bad[0].location}. Fix the data or raise the limit"
            )
        if self.max_fraction is not None and total and n / total > self.max_fraction:
            raise BadRecordsError(
                f"{self.what or origin}: batch {batch_id} has {n} bad records out of {total} ({n / total:.1%}), more "
                f"than maxBadRecordsFraction={self.max_fraction}; first: {bad[0].error} at {bad[0].location}. "
                "Fix the data or raise the limit"
            )
        counts = {"numBadRecords": n, "numBadRecordsDropped": 0, "numBadRecordsDeadLettered": 0}
        if self.policy == "deadLetter" and n:
            self._write(batch_id, origin, bad)
            counts["numBadRecordsDeadLettered"] = n
        elif n:
            counts["numBadRecordsDropped"] = n
        self.last = counts
        for k, v in counts.items():
            self.totals[k] += v
        return counts

    def _write(self, batch_id: int, origin: str, bad: list[BadRecord]) -> None:
        ordered = sorted(bad, key=lambda r: (_natural(r.location), r.error))
        if self.sink is not None:
            docs = [{"batchId": batch_id, "origin": origin, **r.to_dict()} for r in ordered]
            table = pa.table({"batchId": [batch_id] * len(ordered), "origin": [origin] * len(ordered),
                              "location": [r.location for r in ordered], "error": [r.error for r in ordered],
                              "record": [r.record for r in ordered], "key": [r.location for r in ordered],
                              "value": [json.dumps(d, sort_keys=True, default=str) for d in docs]},
                             schema=DEAD_LETTER_SCHEMA)  # fmt: skip
            message = self.sink.write(batch_id, iter(table.to_batches()))
            self.sink.commit(batch_id, [message])  # idempotent per batch id: a replay commits nothing twice
            return
        assert self.path is not None
        folder = os.path.join(self.path, f"batch={batch_id}")
        os.makedirs(folder, exist_ok=True)
        lines = [
            json.dumps({"batchId": batch_id, "origin": origin, **r.to_dict()}, sort_keys=True, default=str)
            for r in ordered
        ]
        atomic_write(os.path.join(folder, f"{_slug(origin)}.jsonl"), ("\n".join(lines) + "\n").encode())

    def __reduce__(self) -> Any:
        raise HeadraceError(
            f"{self.what or 'a connector'}: badRecordsPolicy={self.policy} collects bad records where headrace's "
            "engine runs, so its partitions cannot be read on a pickled copy (e.g. through the Spark adapter); "
            "leave badRecordsPolicy unset there"
        )

    def metrics(self) -> dict[str, int]:
        """The last batch's counts, for the progress report."""
        return dict(self.last) if self.last else {"numBadRecords": 0, "numBadRecordsDropped": 0, "numBadRecordsDeadLettered": 0}


def _clip(text: str | None, n: int = 200) -> str:
    if text is None:
        return "(none)"
    return text if len(text) <= n else text[:n] + "..."


def _slug(origin: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", origin).strip("_") or "records"


def _natural(s: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]


def read_dead_letters(path: str) -> list[dict[str, Any]]:
    """Every dead letter under ``path``, in batch order (tests and tools)."""
    out: list[dict[str, Any]] = []
    if not os.path.isdir(path):
        return out
    batches = sorted((d for d in os.listdir(path) if d.startswith("batch=")), key=lambda d: int(d.split("=", 1)[1]))
    for d in batches:
        for name in sorted(os.listdir(os.path.join(path, d))):
            if not name.endswith(".jsonl"):
                continue
            with open(os.path.join(path, d, name), encoding="utf-8") as f:
                out.extend(json.loads(line) for line in f if line.strip())
    return out

"""``DeltaOffset``: a position in the stream of a Delta table (Spark's ``DeltaSourceOffset``).

Offsets are made and parsed on the driver, once or twice per trigger, and written to the
checkpoint as JSON dicts (``to_json``); they are small frozen values and pickle as such.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from headrace.protocols import Offset

__all__ = ["DeltaOffset"]

log = logging.getLogger(__name__)

_OFFSET_FORMAT = 1


@dataclass(frozen=True, order=True)
class DeltaOffset:
    """A position in the stream of a Delta table; serialized as a JSON dict."""

    version: int
    index: int
    snapshot: bool
    event_time: Any = None

    def to_json(self, table_id: str, event_order: bool) -> Offset:
        out: Offset = {
            "sourceVersion": _OFFSET_FORMAT,
            "reservoirId": table_id,
            "reservoirVersion": self.version,
            "index": self.index,
            "isStartingVersion": self.snapshot,
        }
        if event_order and self.snapshot:
            out["eventTimeStart"] = self.event_time
        return out

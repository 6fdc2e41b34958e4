"""Kafka offsets in Spark's JSON shape (``{"topic": {"partition": next_offset}}``) and the
offset range one read partition covers (``KafkaPartition``).

Pure helpers, called on the driver a few times per trigger; a ``KafkaPartition`` is made on the
driver once per batch and pickled to wherever it is read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headrace.protocols import Offset, Partition
from headrace_kafka._client import TP

__all__ = ["KafkaPartition"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KafkaPartition(Partition):
    """Offsets ``[start, end)`` of one topic-partition. Picklable; holds no configuration."""

    topic: str
    partition: int
    start: int
    end: int


def _flat(offset: Offset) -> dict[TP, int]:
    return {(t, int(p)): int(o) for t, parts in offset.items() for p, o in parts.items()}


def _nested(flat: Mapping[TP, int]) -> Offset:
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(flat.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def _ms(value: Any) -> int:
    """An option value of ``OneOf(Integer, Timestamp)`` as epoch milliseconds."""
    return int(value) if isinstance(value, int) else int(value.timestamp() * 1000)

"""The read work of a batch: shard ranges (``ShardRange``) grouped into tasks (``ShardsPartition``).

Made on the driver by ``KinesisSource.partitions``, once per batch, and pickled to wherever the
partition is read; plain frozen values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from headrace.protocols import Partition
from headrace_kinesis._shards import Position

__all__ = ["ShardRange", "ShardsPartition"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardRange:
    """Records of one shard from ``start`` (a position, see :func:`position`) to ``last_seq``
    inclusive; ``first_seq`` is the first of them when known (else "")."""

    shard_id: str
    start: Position
    first_seq: str
    last_seq: str


@dataclass(frozen=True)
class ShardsPartition(Partition):
    """The read work of one task: one or more shard ranges (``shardsPerTask``). Picklable."""

    ranges: tuple[ShardRange, ...]

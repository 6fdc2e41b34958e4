"""The checkpoint: a write-ahead offsets log, a commits log, metadata and connector state.

Layout (like Spark's)::

    <location>/
      metadata            {"version": 1, "id": <query id>, "name": ..., "sources": [...], "createdAt": ...}
      offsets/<n>         {"version": 1, "batchId": n, "timestamp": ms, "sources": [{"start": .., "end": ..}],
                           "metadata": {"batchWatermarkMs": ..}}  (metadata only with a watermark)
      commits/<n>         {"version": 1, "batchId": n, "timestamp": ms}
      sources/<i>/...     each source's own state (file index, staged data, schema versions)
      sinks/0/...         the sink's own state
      state/<i>/...       the state of the plan's stateful operator number i (versioned by batch)
      .lock               held (flock) by the running query

Every write is atomic: a temporary file in the same folder, flushed and fsynced, then renamed
over the target, then the folder fsynced (so the new name survives a power loss too).
``offsets/<n>`` is durable before batch ``n``'s sink commits anything and ``commits/<n>`` is
renamed into place after the sink committed it, so a batch with an offsets entry and no
commits entry is replayed over the same range with the same batch id. The slow parts of these
writes (the fsyncs) run on background threads, several at once
(:mod:`headrace.checkpoint.writer`). Only the last
``retain`` batches are kept (Spark's ``minBatchesToRetain``, 100), so the log's size and the
cost of a batch do not grow with history.

A checkpoint written by another query (a different query name, or a different set of sources)
is refused, never silently reused; so is a corrupt entry, with the file named.

Modules: :mod:`~headrace.checkpoint.store` (the :class:`Checkpoint` folder: open, lock,
verify, read), :mod:`~headrace.checkpoint.entries` (the entries' format),
:mod:`~headrace.checkpoint.writer` (background writes), :mod:`~headrace.checkpoint.atomic_files`
(crash-safe file writes), :mod:`~headrace.checkpoint.rollback` (reset and summary).
"""

from __future__ import annotations

from headrace.checkpoint.atomic_files import atomic_write
from headrace.checkpoint.entries import OffsetEntry
from headrace.checkpoint.store import Checkpoint

__all__ = ["Checkpoint", "OffsetEntry", "atomic_write"]

"""Acknowledging staged messages and handing others back, off the fetch's critical path.

Staged chunks are acknowledged in the background (a small pool; the client is thread-safe) while
the fetch goes on; ``wait_upto(seq)`` waits for the acks of segments up to ``seq``, so a
segment's rows are deleted only after its acknowledgement was at least tried. A failed ack is
logged and counted: the messages are staged, and a redelivery is dropped by message id.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from google.api_core import exceptions as gexc

from headrace_pubsub._fetch import ACK_CHUNK

__all__ = ["Acker"]

log = logging.getLogger(__name__)

_ACK_THREADS = 4  # Acknowledge requests in flight at once


class Acker:
    """Acknowledge / nack requests for one source. ``ack`` and ``modify`` are the client's calls
    (``ack(ack_ids)``, ``modify(ack_ids, seconds)``)."""

    def __init__(self, ack: Callable[[list[str]], None], modify: Callable[[Sequence[str], int], None]) -> None:
        self._ack = ack
        self._modify = modify
        self._pool: ThreadPoolExecutor | None = None
        self._pending: deque[tuple[int, Future[bool]]] = deque()  # (segment, one ack request), in segment order
        self._lock = threading.Lock()

    def _chunk(self, ack_ids: list[str], stats: dict[str, Any]) -> bool:
        t = time.monotonic()
        try:
            self._ack(ack_ids)
            ok = True
        except gexc.GoogleAPICallError as e:  # staged already: a redelivery is dropped by message id
            log.warning("pubsub: acknowledging %d staged messages failed (%s); Pub/Sub may redeliver them, "
                        "they will be dropped as duplicates within dedupWindow", len(ack_ids), e)  # fmt: skip
            ok = False
        with self._lock:
            stats["ackDurationMs"] = stats.get("ackDurationMs", 0) + int((time.monotonic() - t) * 1000)
            if not ok:
                stats["numAckFailures"] = stats.get("numAckFailures", 0) + 1
        return ok

    def ack_async(self, seq: int, ack_ids: Sequence[str], stats: dict[str, Any]) -> None:
        """Send the acknowledgements of segment ``seq`` in the background; their time and failures
        are added to ``stats`` (the batch's metrics). Called from the source's thread only."""
        self._pending.extend((seq, f) for f in self._submit(ack_ids, stats))

    def ack(self, ack_ids: Sequence[str], stats: dict[str, Any]) -> None:
        """Acknowledge now (the requests at once), e.g. re-acking a resumed segment."""
        for f in self._submit(ack_ids, stats):
            f.result()

    def _submit(self, ack_ids: Sequence[str], stats: dict[str, Any]) -> list[Future[bool]]:
        if not ack_ids:
            return []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_ACK_THREADS, thread_name_prefix="headrace-pubsub-ack")
        pool = self._pool
        return [pool.submit(self._chunk, list(ack_ids[i : i + ACK_CHUNK]), stats) for i in range(0, len(ack_ids), ACK_CHUNK)]

    def wait_upto(self, seq: int) -> None:
        """Wait until the acknowledgements of every segment ``<= seq`` are done (sent or failed)."""
        while self._pending and self._pending[0][0] <= seq:
            _, fut = self._pending.popleft()
            fut.result()

    def nack(self, ack_ids: Sequence[str]) -> None:
        """Hand messages back for redelivery now (ack deadline 0)."""
        for i in range(0, len(ack_ids), ACK_CHUNK):
            try:
                self._modify(ack_ids[i : i + ACK_CHUNK], 0)
            except gexc.GoogleAPICallError as e:
                log.warning("pubsub: handing back messages failed (%s); they are redelivered after the deadline", e)

    def close(self) -> None:
        """Wait for every acknowledgement in flight, then stop the pool. Idempotent."""
        while self._pending:
            _, fut = self._pending.popleft()
            fut.exception()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

"""An admission budget for one batch: how many files, bytes and rows a source takes under a
:class:`~headrace.protocols.ReadLimit` (``maxFilesPerTrigger``, ``maxBytesPerTrigger``,
``maxRecordsPerTrigger`` ...).

Two ways to spend it:

- whole items (files, commits), :meth:`AdmissionBudget.admit`: an item is taken only if every
  cap still holds with it, except the first item of a batch, which is always taken so the stream
  advances (a file larger than ``max_bytes`` is read on its own, as Spark does)::

      budget = AdmissionBudget(limit)
      batch = [f for f in candidates if budget.admit(files=1, bytes=f.size)]   # stops at the first refusal

- record streams whose sizes are known only after a fetch (Pub/Sub, Kinesis),
  :meth:`reserve` / :meth:`give_back` / :meth:`add_bytes`: rows are a hard cap, bytes a soft one
  (fetching stops once ``max_bytes`` is reached, overshooting by at most one fetch). Thread-safe,
  for parallel fetchers.
"""

from __future__ import annotations

import threading

from headrace.protocols import ReadLimit

__all__ = ["AdmissionBudget"]


class AdmissionBudget:
    """What one batch has taken so far against ``limit``. One per ``latest_offset`` call."""

    def __init__(self, limit: ReadLimit | None = None) -> None:
        self.limit = limit or ReadLimit()
        self.files = 0
        self.bytes = 0
        self.rows = 0
        self.items = 0
        self._refused = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ whole items
    def admit(self, *, files: int = 0, bytes: int = 0, rows: int = 0) -> bool:
        """Take one item of that many files, bytes and rows if every cap holds with it (or if it
        is the first); False once an item was refused, and for every item after it."""
        with self._lock:
            if self._refused:
                return False
            lim = self.limit
            if self.items and (
                (lim.max_files is not None and self.files + files > lim.max_files)
                or (lim.max_rows is not None and self.rows + rows > lim.max_rows)
                or (lim.max_bytes is not None and self.bytes + bytes > lim.max_bytes)
            ):
                self._refused = True
                return False
            self.items += 1
            self.files += files
            self.bytes += bytes
            self.rows += rows
            return True

    def close(self) -> None:
        """Spend the budget: every later :meth:`admit` and :meth:`reserve` refuses (e.g. a fetcher
        met a record past the available-now cut and the others must stop)."""
        self._refused = True

    @property
    def closed(self) -> bool:
        """True once an item was refused or :meth:`close` was called."""
        return self._refused

    @property
    def exhausted(self) -> bool:
        """True once an item was refused or a cap is reached: no need to look at more items."""
        lim = self.limit
        return self._refused or any(
            cap is not None and used >= cap
            for cap, used in ((lim.max_files, self.files), (lim.max_rows, self.rows), (lim.max_bytes, self.bytes))
        )

    # ------------------------------------------------------------------ record streams
    def reserve(self, n: int) -> int:
        """Reserve up to ``n`` rows for a fetch: the rows still allowed (all ``n`` without a row
        cap), 0 once the byte budget is spent."""
        with self._lock:
            if self._refused or (self.limit.max_bytes is not None and self.bytes >= self.limit.max_bytes):
                return 0
            if self.limit.max_rows is None:
                return n
            got = max(0, min(n, self.limit.max_rows - self.rows))
            self.rows += got
            return got

    def give_back(self, n: int) -> None:
        """Return ``n`` reserved rows a fetch did not get."""
        if n > 0 and self.limit.max_rows is not None:
            with self._lock:
                self.rows = max(0, self.rows - n)

    def add_bytes(self, n: int, items: int = 1) -> bool:
        """Count ``n`` bytes of ``items`` fetched records; False once the byte budget is spent."""
        with self._lock:
            self.bytes += n
            self.items += items
            return self.limit.max_bytes is None or self.bytes < self.limit.max_bytes

    def estimate(self, n: int, *, first: int = 10) -> int:
        """How many records to ask for so the soft byte budget is overshot by little: about as
        many as fit in the bytes left at the mean size seen so far (``first`` before any)."""
        if self.limit.max_bytes is None:
            return n
        with self._lock:
            if self.items == 0:
                return min(n, first)
            mean = max(1.0, self.bytes / self.items)
            return max(1, min(n, int((self.limit.max_bytes - self.bytes) / mean) + 1))

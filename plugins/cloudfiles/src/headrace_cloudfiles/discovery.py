"""Discovering new files for ``CloudFilesSource``: the name and time filters, directory listings
(incremental when names sort lexically, with periodic full ones) and file events (``useNotifications``).

``FileDiscovery`` is a mixin of :class:`~headrace_cloudfiles.source.CloudFilesSource`; ``_discover``
runs on the driver once per trigger (from ``latest_offset``, or once per run for available-now)
and appends what it finds to the file index. The watcher is not pickled (``__getstate__``).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import time
from typing import TYPE_CHECKING

from headrace_cloudfiles.index import FileIndex
from headrace_cloudfiles.local import LocalStore
from headrace_cloudfiles.storage import FileInfo, Store
from headrace_cloudfiles.watcher import Watcher

__all__ = ["FileDiscovery", "glob_regex"]

log = logging.getLogger(__name__)

_FULL_LISTING_EVERY = 8  # auto mode: a full listing after 7 consecutive incremental ones (as Auto Loader)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A compiled regex for a Hadoop-style glob on file names (``*``, ``?``, ``[ab]``, ``{x,y}``)."""
    out, i, depth = [], 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "{":
            out.append("(?:")
            depth += 1
        elif ch == "}" and depth:
            out.append(")")
            depth -= 1
        elif ch == "," and depth:
            out.append("|")
        elif ch == "[":
            j = pattern.find("]", i)
            if j < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1 : j].replace("\\", "\\\\")
                out.append("[" + ("^" + body[1:] if body.startswith("^") or body.startswith("!") else body) + "]")
                i = j
        else:
            out.append(fnmatch.translate(ch)[4:-3] if ch in "*?" else re.escape(ch))
        i += 1
    return re.compile("".join(out) + r"\Z", re.S)


class FileDiscovery:
    """Mixin of ``CloudFilesSource``: finding new files (see the module docstring)."""

    # set by CloudFilesSource.__init__
    path: str
    store: Store
    glob: re.Pattern[str] | None
    after_ms: int | None
    before_ms: int | None
    max_age: float | None
    backfill: float | None
    listing: str
    notifications: bool
    allow_overwrites: bool
    _watcher: Watcher | None
    _discovered_this_run: bool

    if TYPE_CHECKING:  # defined by CloudFilesSource

        @property
        def index(self) -> FileIndex: ...

    # ------------------------------------------------------------------ discovery
    def _wanted(self, f: FileInfo, now_ms: int) -> bool:
        if self.glob is not None and not self.glob.match(f.rel.rsplit("/", 1)[-1]):
            return False
        if self.after_ms is not None and f.mtime_ms <= self.after_ms:
            return False
        if self.before_ms is not None and f.mtime_ms >= self.before_ms:
            return False
        return not (self.max_age is not None and f.mtime_ms < now_ms - self.max_age * 1000)

    def _listing(self, start_after: str | None) -> tuple[list[FileInfo], str | None]:
        """Files listed (after ``start_after``) that pass the filters, and the last path listed."""
        now = int(time.time() * 1000)
        out, last = [], start_after
        for f in self.store.list(start_after):
            if last is None or f.rel > last:
                last = f.rel
            if self._wanted(f, now):
                out.append(f)
        return out, last

    def _full_due(self, idx: FileIndex) -> bool:
        if self.backfill is None:
            return False
        last = int(idx.get("last_full_ms", "0") or 0)
        return time.time() * 1000 - last >= self.backfill * 1000

    def _discover(self) -> int:
        """Find new files and add them to the index; returns how many. Once per trigger."""
        idx = self.index
        now_ms = str(int(time.time() * 1000))
        first = not self._discovered_this_run
        self._discovered_this_run = True
        if self.notifications:
            assert isinstance(self.store, LocalStore)
            if self._watcher is None:
                os.makedirs(self.store.root, exist_ok=True)
                self._watcher = Watcher(self.store)
            if first or self._full_due(idx):
                files, _ = self._listing(None)
                idx.set("last_full_ms", now_ms)
                self._watcher.drain()  # the listing saw everything these events name
                return idx.add(files, allow_overwrites=self.allow_overwrites)
            now = int(time.time() * 1000)
            found = []
            for rel in self._watcher.drain():
                parts = rel.split("/")
                if any(p.startswith(("_", ".")) for p in parts):
                    continue
                info = self.store.stat(rel)
                if info is not None and self._wanted(info, now):
                    found.append(info)
            found.sort(key=lambda f: f.rel)
            return idx.add(found, allow_overwrites=self.allow_overwrites)
        watermark = idx.get("watermark")
        lexical = idx.get("lexical", "unknown")  # auto mode: yes once a full listing showed new names sort last
        streak = int(idx.get("incremental_streak", "0") or 0)
        if self.listing == "false" or watermark is None:
            incremental = False
        elif self.listing == "true":
            incremental = not self._full_due(idx)
        else:  # auto
            incremental = lexical == "yes" and streak < _FULL_LISTING_EVERY - 1 and not self._full_due(idx)
        files, last = self._listing(watermark if incremental else None)
        known = idx.known([f.rel for f in files]) if not incremental and watermark is not None else {}
        if not incremental and watermark is not None and lexical != "no":
            new = [f.rel for f in files if f.rel not in known]
            if any(rel <= watermark for rel in new):
                idx.set("lexical", "no")  # a new file sorted before the last seen: names are not lexical
                log.info("cloudFiles: new files under %s do not sort after the ones seen; using full listings", self.path)
            elif new:
                idx.set("lexical", "yes")
        if last is not None and (watermark is None or last > watermark):
            idx.set("watermark", last)
        idx.set("incremental_streak", str(streak + 1 if incremental else 0))
        if not incremental:
            idx.set("last_full_ms", now_ms)
        return idx.add(files, allow_overwrites=self.allow_overwrites, known=known if known else None)

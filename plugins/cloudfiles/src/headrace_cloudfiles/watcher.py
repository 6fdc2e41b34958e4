"""File-event mode (``cloudFiles.useNotifications``): a watchdog observer on a local folder.

Events only say *which* paths changed; the source stats them when it next discovers files, so
an event for a file that is gone again, or a duplicate event, costs one ``stat``. watchdog is
imported only when this mode is used.
"""

from __future__ import annotations

import threading
from typing import Any

from headrace.errors import HeadraceError
from headrace_cloudfiles.local import LocalStore

__all__ = ["Watcher"]


class Watcher:
    """Collects the relative paths of files created, modified, closed or moved into the root.

    Started once per query run (before the first full listing, so nothing falls between the
    listing and the events); ``drain`` is called once per trigger on the driver.
    """

    def __init__(self, store: LocalStore) -> None:
        try:
            from watchdog.events import FileSystemEvent, FileSystemEventHandler
            from watchdog.observers import Observer
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise HeadraceError(
                "cloudFiles.useNotifications needs watchdog, which is not installed; "
                "fix: pip install 'headrace-cloudfiles[notifications]'"
            ) from e
        self.store = store
        self._lock = threading.Lock()
        self._pending: dict[str, None] = {}
        watcher = self

        class Handler(FileSystemEventHandler):
            def on_any_event(self, event: FileSystemEvent) -> None:
                if event.is_directory or event.event_type in ("deleted", "opened", "closed_no_write"):
                    return
                path = getattr(event, "dest_path", "") or event.src_path
                watcher._note(path if isinstance(path, str) else path.decode())

        self._observer: Any = Observer()
        self._observer.schedule(Handler(), store.root, recursive=True)
        self._observer.daemon = True
        self._observer.start()

    def _note(self, path: str) -> None:
        rel = self.store.rel_of(path)
        if rel is not None:
            with self._lock:
                self._pending[rel] = None

    def drain(self) -> list[str]:
        """The paths seen since the last call, in event order, each once."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
        return out

    def close(self) -> None:
        """Stop the observer thread. Idempotent."""
        obs, self._observer = self._observer, None
        if obs is not None:
            obs.stop()
            obs.join(timeout=5)

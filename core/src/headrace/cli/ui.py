"""``headrace ui [CHECKPOINT_DIR ...]``: the live dashboard of the queries in checkpoint folders."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from headrace.cli import say
from headrace.errors import HeadraceError

__all__ = ["register"]


def _ui(args: argparse.Namespace) -> int:
    from headrace.ui import start_ui

    for d in args.dirs:
        if not os.path.isdir(d):
            raise HeadraceError(f"{d} is not a folder; give checkpoint folders or folders that hold checkpoints")
    ui = start_ui(args.dirs or ["."], port=args.port, host=args.host, refresh_ms=args.refresh_ms)
    found = len(ui.catalog.checkpoints())
    say(f"dashboard on {ui.url} ({found} checkpoint{'s' if found != 1 else ''} found; Ctrl-C to stop)")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    ui.close()
    return 0


def register(sub: Any) -> None:
    """Add ``ui`` to the ``headrace`` parser's subcommands."""
    u = sub.add_parser("ui", help="serve a live web dashboard of the queries in checkpoint folders")
    u.add_argument("dirs", nargs="*", metavar="CHECKPOINT_DIR",
                   help="checkpoints, or folders holding checkpoints (searched 4 levels down; default: .)")
    u.add_argument("--port", type=int, default=4040, help="port (default 4040; 0: any free port)")
    u.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1; 0.0.0.0: all)")
    u.add_argument("--refresh-ms", type=int, default=1000, help="how often the page polls (default 1000)")
    u.set_defaults(fn=_ui)

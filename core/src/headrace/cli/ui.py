"""``headrace ui [CHECKPOINT_DIR ...]``: the live dashboard of the queries in checkpoint folders.

The access token comes from ``HEADRACE_UI_TOKEN``; ``--allow-host`` and ``--allow-insecure-bind``
widen what the dashboard answers (see ``headrace.ui.start_ui``)."""

from __future__ import annotations

import argparse
import os
import signal
import threading
from typing import Any

from headrace._words import counted
from headrace.cli import say
from headrace.errors import HeadraceError

__all__ = ["register", "ui_token"]


def ui_token() -> str | None:
    """The dashboard's access token from ``HEADRACE_UI_TOKEN`` (None when unset or empty): an
    environment variable, not an option, so it stays out of the process list and shell history."""
    from headrace.ui import TOKEN_ENV

    return os.environ.get(TOKEN_ENV, "").strip() or None


def _ui(args: argparse.Namespace) -> int:
    from headrace.ui import start_ui

    for d in args.dirs:
        if not os.path.isdir(d):
            what = "does not exist" if not os.path.lexists(d) else "is not a folder"
            raise HeadraceError(f"{d} {what}; give checkpoint folders or folders that hold checkpoints")
    token = ui_token()
    ui = start_ui(args.dirs or ["."], port=args.port, host=args.host, refresh_ms=args.refresh_ms, token=token,
                  allow_insecure_bind=args.allow_insecure_bind, allowed_hosts=args.allow_host)  # fmt: skip
    found = len(ui.catalog.checkpoints())
    access = "; access token required (open it with ?token=...)" if token else ""
    say(f"dashboard on {ui.url} ({counted(found, 'checkpoint')} found{access}; Ctrl-C to stop)")
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
    u.add_argument("--refresh-ms", type=int, default=1000, help="how often the page polls, 100..3600000 (default 1000)")
    u.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="another host name the browser may use to reach the dashboard, with any port (repeatable; "
                        "'*': any). Answered by default: IP addresses, the --host name and localhost, with --port")
    u.add_argument("--allow-insecure-bind", action="store_true",
                   help="serve an address other machines can reach without an access token (default: refused; "
                        "set HEADRACE_UI_TOKEN instead)")
    u.set_defaults(fn=_ui)

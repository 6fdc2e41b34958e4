"""The ``headrace`` command: one module per command group, registered on one parser.

- :mod:`headrace.cli.connectors`: ``connectors``, ``describe``
- :mod:`headrace.cli.pipelines`: ``run``, ``validate``
- :mod:`headrace.cli.checkpoint`: ``checkpoint show`` / ``checkpoint reset``

A command group is a module with ``register(subparsers)`` that adds its subcommands, each
with ``set_defaults(fn=handler)``; ``handler(args) -> int`` is the exit code. Add a module to
``_GROUPS`` to add a group.

No traceback ever reaches the user: an error prints one line ``headrace: error: ...`` and the
command exits non-zero (``--debug`` shows the traceback). A closed stdout (``| head``) ends the
command quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from headrace.errors import HeadraceError, redact

__all__ = ["build_parser", "main"]

_GROUPS = ("headrace.cli.connectors", "headrace.cli.pipelines", "headrace.cli.checkpoint")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("headrace")
    except PackageNotFoundError:
        return "unknown (not installed as a distribution)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headrace", description="Streams to the lakehouse, with Spark's semantics.")
    parser.add_argument("--version", action="version", version=f"headrace {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--debug", action="store_true", help="log at DEBUG level and show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _GROUPS:
        importlib.import_module(name).register(sub)
    return parser


def _error(message: str) -> None:
    print(f"headrace: error: {redact(message)}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        code = int(args.fn(args))
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        # the reader went away (`headrace describe delta | head -1`): stop quietly, and keep
        # Python from complaining while it flushes stdout at exit
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except HeadraceError as e:
        if args.debug:
            traceback.print_exc()
        _error(str(e))
        return 1
    except Exception as e:
        if args.debug:
            traceback.print_exc()
        _error(f"{type(e).__name__}: {e}" + ("" if args.debug else " (run with --debug for the traceback)"))
        return 1


if __name__ == "__main__":
    sys.exit(main())

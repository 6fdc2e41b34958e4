"""The ``headrace`` command: one module per command group, registered on one parser.

- :mod:`headrace.cli.connectors`: ``connectors``, ``describe``
- :mod:`headrace.cli.plugins`: ``new-plugin`` (and ``connectors --check`` / ``-v``)
- :mod:`headrace.cli.run`: ``run``, ``validate`` (single-flow TOML pipelines)
- :mod:`headrace.cli.ui`: ``ui`` (the dashboard)
- :mod:`headrace.pipelines.cli`: ``pipelines ...`` (declarative pipelines)
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

__all__ = ["build_parser", "main", "say"]

_GROUPS = (
    "headrace.cli.connectors",
    "headrace.cli.plugins",
    "headrace.cli.run",
    "headrace.cli.ui",
    "headrace.cli.checkpoint",
    "headrace.pipelines.cli",
)

log = logging.getLogger(__name__)
_json_logs = False


def say(message: str, level: int = logging.INFO) -> None:
    """A status line for the person at the terminal, on stderr: plain text, or with
    ``--log-format json`` a JSON log record like every other line there."""
    if _json_logs:
        from headrace.logs import JsonFormatter

        record = log.makeRecord(log.name, level, __file__, 0, redact(message), (), None)
        print(JsonFormatter().format(record), file=sys.stderr, flush=True)
    else:
        print(redact(message), file=sys.stderr, flush=True)


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
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="log lines on stderr as text or as one JSON object per line (default text)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _GROUPS:
        importlib.import_module(name).register(sub)
    return parser


def _error(message: str) -> None:
    if _json_logs:
        say(f"error: {message}", level=logging.ERROR)
    else:
        print(f"headrace: error: {redact(message)}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
    from headrace.logs import configure_logging

    global _json_logs
    _json_logs = args.log_format == "json"
    configure_logging(level, args.log_format)
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

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
command exits non-zero (``--debug`` shows the traceback). That holds for failures inside queries
and pipeline flows too: without ``--debug`` log records are printed without their tracebacks, and
a query's own failure record (which the command reports as its error line) is not printed at all;
an exception escaping a thread is logged the same way. ``--log-format json`` keeps every record
and its ``exception`` field (for log collectors, not for reading at a terminal). A closed stdout (``| head``) ends the
command quietly.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import threading
import traceback
from collections.abc import Sequence

from headrace.errors import HeadraceError, redact

__all__ = ["FIXED_WIDTH", "build_parser", "main", "say", "terminal_width", "wrap"]

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


#: the width of output lines when stdout is not a terminal (files, pipes, tests)
FIXED_WIDTH = 100


def terminal_width() -> int:
    """Columns to wrap output to: the terminal's width when stdout is one (at least 40), else
    ``FIXED_WIDTH``."""
    import shutil

    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return max(40, shutil.get_terminal_size((FIXED_WIDTH, 24)).columns) if tty else FIXED_WIDTH


def wrap(text: str, *, indent: str = "", hang: str | None = None, width: int | None = None) -> list[str]:
    """``text`` wrapped to the terminal (``terminal_width``): the first line after ``indent``,
    the next ones after ``hang`` (default: ``indent``). Words longer than a line (paths, URLs)
    are kept whole."""
    import textwrap

    return textwrap.wrap(text, width or terminal_width(), initial_indent=indent,
                         subsequent_indent=indent if hang is None else hang,
                         break_long_words=False, break_on_hyphens=False) or [indent]  # fmt: skip


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


class _NoTracebacks(logging.Filter):
    """Without ``--debug``: log records lose their tracebacks, and a query's failure record
    (marked ``query_failure``; the command prints that failure as its one error line) is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "query_failure", False):
            return False
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        return True


def _thread_failed(args: threading.ExceptHookArgs) -> None:
    """An exception escaping a thread: one log record (its traceback only with ``--debug``)."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    exc = (args.exc_type, args.exc_value, args.exc_traceback) if args.exc_value is not None else None
    log.error("thread %s failed: %s: %s", name, args.exc_type.__name__, args.exc_value, exc_info=exc)


def _configure_logging(debug: bool, verbose: bool, fmt: str) -> None:
    from headrace.logs import configure_logging

    configure_logging(logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING, fmt)
    if not debug and fmt == "text":  # JSON lines are for machines: they keep the traceback field
        for h in logging.getLogger().handlers:
            if getattr(h, "_headrace", False):
                h.addFilter(_NoTracebacks())
    threading.excepthook = _thread_failed


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    global _json_logs
    _json_logs = args.log_format == "json"
    _configure_logging(args.debug, args.verbose, args.log_format)
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

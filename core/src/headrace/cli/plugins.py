"""The plugin authors' part of the ``headrace`` command: ``connectors --check`` / ``-v`` and
``new-plugin``. Registered by ``headrace.cli`` with two calls (:func:`add_connectors_options`,
:func:`add_commands`) and :func:`connectors_report`, run after the connector table."""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_commands", "add_connectors_options", "connectors_report"]


def add_connectors_options(parser: argparse.ArgumentParser) -> None:
    """Options of ``headrace connectors``."""
    parser.add_argument("--check", action="store_true",
                        help="also import every connector's source and sink class; exit 1 if one fails")  # fmt: skip
    parser.add_argument("-v", "--verbose", dest="connectors_verbose", action="store_true",
                        help="show the traceback of each plugin that failed to load")  # fmt: skip


def connectors_report(args: argparse.Namespace, reg: Any) -> int:
    """Plugin problems, tracebacks (``-v``) and the class imports (``--check``); returns the exit
    code: with ``--check``, 1 when anything is wrong; without, 0."""
    rc = 1 if reg.broken() else 0
    if getattr(args, "connectors_verbose", False) or getattr(args, "verbose", False):
        for (name, dist), trace in reg.tracebacks().items():
            print(f"\n--- traceback of plugin '{name}' from {dist}:\n{trace.rstrip()}")
    for name, dist, problem in reg.problems():
        print(f"! plugin '{name}' from {dist}: {problem}")
        rc = 1
    if getattr(args, "check", False):
        print()
        for spec in reg.specs():
            for role, path in (("source", spec.source), ("sink", spec.sink)):
                if not path:
                    continue
                try:
                    cls = getattr(spec, f"load_{role}")()
                    if not isinstance(cls, type):
                        raise TypeError(f"{path} is a {type(cls).__name__}, not a class")
                except Exception as e:
                    print(f"FAIL {spec.name} {role} {path} ({spec.distribution}): {e}")
                    rc = 1
                else:
                    print(f"ok   {spec.name} {role} {path}")
        if rc:
            print("connectors --check: problems found (above)", file=sys.stderr)
        return rc
    return 0


def add_commands(sub: Any) -> None:
    """``headrace new-plugin``."""
    p = sub.add_parser("new-plugin", help="write a new plugin distribution (source and/or sink, contract tests)")
    p.add_argument("name", help="connector name, e.g. acme (distribution headrace-acme, package headrace_acme)")
    p.add_argument("--source", action="store_true", help="with a source (default: both source and sink)")
    p.add_argument("--sink", action="store_true", help="with a sink (default: both source and sink)")
    p.add_argument("--dir", default=None, help="where to write it (default: ./headrace-NAME)")
    p.add_argument("--force", action="store_true", help="write into an existing, non-empty folder")
    p.set_defaults(fn=_new_plugin)


def _new_plugin(args: argparse.Namespace) -> int:
    from headrace.scaffold import new_plugin

    both = not args.source and not args.sink
    out = new_plugin(args.name, source=args.source or both, sink=args.sink or both, directory=args.dir, force=args.force)
    print(f"wrote {out}; next:\n  pip install -e '{out}[test]'\n  pytest {out}")
    return 0


def register(sub: Any) -> None:
    """Add ``new-plugin`` to the ``headrace`` parser's subcommands."""
    add_commands(sub)

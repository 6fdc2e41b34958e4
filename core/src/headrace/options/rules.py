"""Cross-option rules (``exactly_one_of``, ``at_most_one_of``, ...), checked after every option parsed.

A rule's ``check`` is called once per parse of the options (on the driver, before any I/O) with
the typed options, and returns the problems it finds; it must not raise for a hostile value.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headrace.errors import OptionProblem

if TYPE_CHECKING:
    from headrace.options.values import Options

__all__ = ["Rule", "all_or_none", "at_most_one_of", "exactly_one_of", "requires", "rule"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """A cross-option rule. ``check`` gets the options given (typed) and returns problems."""

    doc: str
    check: Callable[[Options], list[OptionProblem]]


def rule(doc: str) -> Callable[[Callable[[Options], list[OptionProblem]]], Rule]:
    """Decorator form: ``@rule("doc")`` over ``def check(opts) -> list[OptionProblem]``."""
    return lambda fn: Rule(doc, fn)


def exactly_one_of(*names: str) -> Rule:
    def check(opts: Options) -> list[OptionProblem]:
        given = [n for n in names if opts.is_set(n)]
        if len(given) == 1:
            return []
        what = "none of them is set" if not given else f"{', '.join(given)} are all set"
        return [OptionProblem(" / ".join(names), f"set exactly one of {', '.join(names)} ({what})")]

    return Rule(f"exactly one of {', '.join(names)}", check)


def at_most_one_of(*names: str) -> Rule:
    def check(opts: Options) -> list[OptionProblem]:
        given = [n for n in names if opts.is_set(n)]
        if len(given) <= 1:
            return []
        return [OptionProblem(" / ".join(given), f"cannot be used together; choose one of {', '.join(given)}")]

    return Rule(f"at most one of {', '.join(names)}", check)


def all_or_none(*names: str) -> Rule:
    def check(opts: Options) -> list[OptionProblem]:
        given = [n for n in names if opts.is_set(n)]
        if not given or len(given) == len(names):
            return []
        missing = [n for n in names if n not in given]
        return [OptionProblem(" / ".join(names), f"go together: {', '.join(given)} is set but {', '.join(missing)} is not")]

    return Rule(f"{', '.join(names)} only together", check)


def requires(name: str, *others: str) -> Rule:
    def check(opts: Options) -> list[OptionProblem]:
        if not opts.is_set(name):
            return []
        missing = [o for o in others if not opts.is_set(o)]
        return [OptionProblem(name, f"needs {', '.join(missing)} as well")] if missing else []

    return Rule(f"{name} needs {', '.join(others)}", check)

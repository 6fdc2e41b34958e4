"""Secret option values: a wrapper whose ``str()`` and ``repr()`` never show the value.

A :class:`Secret` is created when an option declared ``secret=True`` (or a pass-through key that
looks like a credential) is parsed; the value is registered with :func:`headrace.errors.register_secret`
so that any error or log line mentioning it is redacted. A ``Secret`` pickles (it travels to
Spark executors inside the options of a source or sink) and is registered again where it is
unpickled.
"""

from __future__ import annotations

import logging
from typing import Any

from headrace.errors import register_secret

__all__ = ["Secret"]

log = logging.getLogger(__name__)


class Secret:
    """A secret value. ``str()`` and ``repr()`` never show it; ``reveal()`` does."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value
        register_secret(value)  # so that headrace.errors.redact removes it from any error or log line

    def reveal(self) -> Any:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self._value,))

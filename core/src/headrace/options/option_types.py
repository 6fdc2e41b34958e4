"""Option types: how a value is written by a user and coerced to a typed value.

Each :class:`OptionType` has a ``parse`` that is called once per option given, when the options
are parsed (before any I/O), and raises ``ValueError`` saying what is expected. Types are plain
objects held by declarations; they pickle with them.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import math
import re
import warnings
from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

from headrace.options._text import _short, suggest

__all__ = [
    "Boolean",
    "Choice",
    "Duration",
    "Float",
    "Integer",
    "Json",
    "OneOf",
    "OptionType",
    "PyObject",
    "Regex",
    "Size",
    "String",
    "StringList",
    "Timestamp",
]

log = logging.getLogger(__name__)

T = TypeVar("T", covariant=True)


class OptionType(ABC, Generic[T]):
    """How a value is written and coerced. ``parse`` raises ValueError saying what is expected.

    ``T`` is the type ``parse`` returns (``Integer`` is an ``OptionType[int]``), so
    ``Option("n", Integer())`` is an ``Option[int]`` and ``options[N]`` an ``int``."""

    label = "string"

    @abstractmethod
    def parse(self, value: Any) -> Any:
        """The typed value of ``value`` (a string from a user, or already typed)."""

    def render(self, value: Any) -> str:
        """The default value as a user would write it (for ``describe``)."""
        return json.dumps(value) if isinstance(value, list | dict) else str(value)


class String(OptionType[str]):
    label = "string"

    def __init__(self, *, pattern: str | None = None, hint: str = "") -> None:
        self.pattern = re.compile(pattern) if pattern else None
        self.hint = hint

    def parse(self, value: Any) -> Any:
        if isinstance(value, bytes | bytearray | dict | list):
            raise ValueError(f"expected a string, got {type(value).__name__}")
        text = str(value)
        if "\x00" in text:  # no path, name or client setting can hold one (C libraries stop there)
            raise ValueError(f"{_short(text)} contains a NUL character")
        if self.pattern is not None and not self.pattern.fullmatch(text):
            raise ValueError(f"{_short(text)} is not valid{': ' + self.hint if self.hint else ''}")
        return text


# Integers go to client libraries (librdkafka, Arrow, libpq) as 64-bit values: larger ones are
# refused at parse time instead of overflowing later.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Durations go to sleeps and waits (threading's TIMEOUT_MAX is ~292 years): 100 years at most.
MAX_DURATION_SECONDS = 100 * 365.25 * 86400
_ASCII_INT = re.compile(r"[+-]?[0-9]{1,40}")


class Regex(String):
    """A regular expression (Python's ``re`` syntax), checked when the options are parsed so a
    bad one is an options error at ``load()``, not a ``re.error`` at ``start()``. The value
    stays a string (options are printed and pickled); compile it where it is used."""

    label = "regex"

    def parse(self, value: Any) -> Any:
        text = super().parse(value)
        try:
            with warnings.catch_warnings():  # FutureWarnings about odd but valid patterns
                warnings.simplefilter("ignore")
                re.compile(text)
        except (re.error, RecursionError, OverflowError, ValueError) as e:
            raise ValueError(f"{_short(text)} is not a valid regular expression ({e})") from None
        return text


class Integer(OptionType[int]):
    label = "int"

    def __init__(self, *, min: int | None = None, max: int | None = None) -> None:
        self.min = INT64_MIN if min is None else min
        self.max = INT64_MAX if max is None else max

    def parse(self, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"{_short(value)} is not an integer")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int):
            n = value
        else:
            text = str(value).strip().replace("_", "")
            if not _ASCII_INT.fullmatch(text):
                raise ValueError(f"{_short(value)} is not an integer (write digits 0-9, at most 19 of them)")
            n = int(text)
        if self.min is not None and n < self.min:
            raise ValueError(f"{_short(n)} is less than the minimum {self.min}")
        if self.max is not None and n > self.max:
            raise ValueError(f"{_short(n)} is more than the maximum {self.max}")
        return n


class Float(OptionType[float]):
    label = "float"

    def __init__(self, *, min: float | None = None, max: float | None = None) -> None:
        self.min, self.max = min, max

    def parse(self, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"{_short(value)} is not a number")
        try:
            x = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{_short(value)} is not a number") from None
        if not math.isfinite(x):
            raise ValueError(f"{_short(value)} is not a finite number")
        if self.min is not None and x < self.min:
            raise ValueError(f"{x} is less than the minimum {self.min}")
        if self.max is not None and x > self.max:
            raise ValueError(f"{x} is more than the maximum {self.max}")
        return x


class Boolean(OptionType[bool]):
    label = "bool"
    _TRUE = {"true", "1", "yes", "on"}
    _FALSE = {"false", "0", "no", "off"}

    def parse(self, value: Any) -> Any:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in self._TRUE:
            return True
        if text in self._FALSE:
            return False
        raise ValueError(f"{_short(value)} is not a boolean (use true or false)")

    def render(self, value: Any) -> str:
        return "true" if value else "false"


_DURATION_UNITS = {
    "ms": 0.001, "milli": 0.001, "millis": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
}  # fmt: skip


class Duration(OptionType[float]):
    """A duration such as ``"100 milliseconds"``, ``"5 minutes"``, ``"10s"``, ``"1.5h"``.

    Parsed to seconds (float). A bare number is in ``unit`` (seconds unless stated).
    """

    label = "duration"

    def __init__(self, *, unit: str = "seconds", min: float | None = 0.0) -> None:
        self.unit = unit
        self.min = min

    def parse(self, value: Any) -> Any:
        bad = f"{_short(value)} is not a duration (write e.g. '100 milliseconds', '10 seconds', '5 minutes', '2h')"
        try:
            if isinstance(value, dt.timedelta):
                seconds = value.total_seconds()
            elif isinstance(value, int | float) and not isinstance(value, bool):
                seconds = float(value) * _DURATION_UNITS[self.unit]
            else:
                text = str(value).strip().lower()
                m = re.fullmatch(r"(?:interval\s+)?([+-]?[0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([a-z]*)", text)
                if not m or (m.group(2) and m.group(2) not in _DURATION_UNITS):
                    raise ValueError(bad)
                seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2) or self.unit]
        except OverflowError:
            raise ValueError(bad) from None
        if not math.isfinite(seconds) or seconds > MAX_DURATION_SECONDS:
            raise ValueError(f"{_short(value)} is longer than the maximum of 100 years")
        if self.min is not None and seconds < self.min:
            raise ValueError(f"{_short(value)} is shorter than the minimum {self.min} seconds")
        return seconds

    def render(self, value: Any) -> str:
        return value if isinstance(value, str) else f"{value} {self.unit}"


_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1024, "kib": 1024, "m": 1024**2, "mb": 1024**2, "mib": 1024**2,
               "g": 1024**3, "gb": 1024**3, "gib": 1024**3, "t": 1024**4, "tb": 1024**4, "tib": 1024**4}  # fmt: skip


class Size(OptionType[int]):
    """A byte size such as ``"10g"``, ``"512k"``, ``"1.5 MB"`` or ``1048576`` (units are binary, as in Spark)."""

    label = "size"

    def parse(self, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            text = str(value).strip().lower()
            m = re.fullmatch(r"([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([a-z]*)", text)
            if not m or m.group(2) not in _SIZE_UNITS:
                raise ValueError(f"{_short(value)} is not a size (write e.g. '10g', '512m', '64k' or a number of bytes)")
            n = int(decimal.Decimal(m.group(1)) * _SIZE_UNITS[m.group(2)])
        if n <= 0:
            raise ValueError(f"{_short(value)} must be more than 0 bytes")
        if n > INT64_MAX:
            raise ValueError(f"{_short(value)} is more than the maximum of 8 EiB")
        return n


class Timestamp(OptionType[dt.datetime]):
    """A point in time: ISO 8601 (``2024-05-01``, ``2024-05-01T12:00:00Z``) or epoch milliseconds.

    Parsed to an aware ``datetime`` in UTC; a value without a zone is taken as UTC.
    """

    label = "timestamp"

    def parse(self, value: Any) -> Any:
        if isinstance(value, dt.datetime):
            ts = value
        elif isinstance(value, dt.date):
            ts = dt.datetime(value.year, value.month, value.day)
        else:
            bad = f"{_short(value)} is not a timestamp (write e.g. '2024-05-01', '2024-05-01T12:00:00Z' or epoch ms)"
            try:
                if isinstance(value, int | float) and not isinstance(value, bool):
                    ts = dt.datetime.fromtimestamp(value / 1000, tz=dt.UTC)
                else:
                    text = str(value).strip()
                    if re.fullmatch(r"[0-9]{10,}", text):
                        ts = dt.datetime.fromtimestamp(int(text) / 1000, tz=dt.UTC)
                    else:
                        ts = dt.datetime.fromisoformat(text.replace(" UTC", "+00:00"))
            except (ValueError, OverflowError, OSError):
                raise ValueError(bad) from None
        try:
            return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)
        except (ValueError, OverflowError) as e:
            raise ValueError(f"{_short(value)} is out of the range of timestamps ({e})") from None


class StringList(OptionType[list[str]]):
    """A comma-separated list (``"a, b"``) or a Python list of strings."""

    label = "list"

    def __init__(self, *, sep: str = ",", min_items: int = 0) -> None:
        self.sep = sep
        self.min_items = min_items

    def parse(self, value: Any) -> Any:
        items = [str(v).strip() for v in value] if isinstance(value, list | tuple) else str(value).split(self.sep)
        items = [i.strip() for i in items if i.strip()]
        if len(items) < self.min_items:
            raise ValueError(f"{_short(value)} needs at least {self.min_items} item(s)")
        return items

    def render(self, value: Any) -> str:
        return self.sep.join(value) if isinstance(value, list) else str(value)


class Choice(OptionType[str]):
    """One of a fixed set of words, matched case-insensitively, returned in canonical spelling."""

    def __init__(self, *choices: str) -> None:
        self.choices = choices
        self.label = " | ".join(choices)

    def parse(self, value: Any) -> Any:
        text = str(value).strip()
        for c in self.choices:
            if c.lower() == text.lower():
                return c
        hint = suggest(text, self.choices)
        allowed = ", ".join(repr(c) for c in self.choices)
        raise ValueError(f"{_short(value)} is not one of {allowed}" + (f" (did you mean {hint!r}?)" if hint else ""))


class Json(OptionType[Any]):
    """A JSON document (string) or the equivalent Python value."""

    label = "json"

    def parse(self, value: Any) -> Any:
        if isinstance(value, dict | list):
            return value
        try:
            return json.loads(str(value))
        except json.JSONDecodeError as e:
            raise ValueError(f"{_short(value)} is not valid JSON ({e.msg} at position {e.pos})") from None
        except RecursionError:
            raise ValueError(f"{_short(value)} is nested too deeply to be an option's JSON") from None
        except ValueError as e:  # e.g. an integer of more than 4300 digits
            raise ValueError(f"{_short(value)} is not usable JSON ({e})") from None


class OneOf(OptionType[Any]):
    """The first of several types that accepts the value, e.g. ``OneOf(Integer(), Choice("latest"))``."""

    def __init__(self, *types: OptionType) -> None:
        self.types = types
        self.label = " or ".join(t.label for t in types)

    def parse(self, value: Any) -> Any:
        for t in self.types:
            try:
                return t.parse(value)
            except ValueError:
                continue
        raise ValueError(f"{_short(value)} is not {self.label}")


class PyObject(OptionType[Any]):
    """A Python object given through the API (e.g. a function); ``callable_`` requires a callable."""

    label = "object"

    def __init__(self, *, callable_: bool = False) -> None:
        self.callable_ = callable_
        if callable_:
            self.label = "callable"

    def parse(self, value: Any) -> Any:
        if self.callable_ and not callable(value):
            raise ValueError(f"{type(value).__name__} is not callable; pass a function")
        return value

"""Declarative, typed connector options: parsing, coercion, validation, documentation.

A connector declares its options once::

    SCHEMA = OptionSchema(
        [
            Option("maxFilesPerTrigger", Integer(min=1), default=1000, doc="Files per batch, at most."),
            Option("startingVersion", OneOf(Integer(min=0), Choice("latest")), doc="..."),
            Option("password", String(), secret=True),
        ],
        rules=[at_most_one_of("startingVersion", "startingTimestamp")],
        passthrough=[PassThrough("kafka.", doc="Passed to the Kafka client")],
    )
    opts = SCHEMA.parse(raw, connector="delta", role="source")   # raises OptionsError
    opts["maxfilespertrigger"]  # -> 1000 (names match case-insensitively)

Names are matched case-insensitively (so a Databricks ``.option(...)`` chain ports as it is),
string values are coerced by type, and every problem is reported at once, each naming the
option, the bad value and what would be accepted, with a did-you-mean for unknown names.
Secret values are wrapped in :class:`Secret` and never appear in reprs, logs or errors.
"""

from __future__ import annotations

import datetime as dt
import decimal
import difflib
import json
import math
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

if TYPE_CHECKING:
    from headrace.protocols import ReadLimit

from headrace.errors import OptionProblem, OptionsError, register_secret

__all__ = [
    "Boolean",
    "Choice",
    "Duration",
    "Float",
    "Integer",
    "Json",
    "OneOf",
    "Option",
    "OptionSchema",
    "OptionType",
    "Options",
    "PassThrough",
    "PyObject",
    "Regex",
    "Rule",
    "Secret",
    "Size",
    "String",
    "StringList",
    "Timestamp",
    "all_or_none",
    "at_most_one_of",
    "exactly_one_of",
    "requires",
    "rule",
    "suggest",
]


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (hostile values can be megabytes long)."""
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..." + f" ({len(text)} chars)"


def suggest(name: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``name`` (case-insensitive), or None."""
    by_lower = {c.lower(): c for c in candidates}
    match = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[match[0]] if match else None


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


# --------------------------------------------------------------------------- types

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


# --------------------------------------------------------------------------- declaration


_READ_LIMIT_FIELDS = ("max_files", "max_bytes", "max_rows", "min_rows", "max_trigger_delay")


@dataclass(frozen=True)
class Option(Generic[T]):
    """One option: name (the reference's spelling), type, default, documentation.

    ``unsupported`` marks an option of the reference that headrace does not support (e.g. one
    that only makes sense on Databricks): it is listed by ``describe`` and rejected with this
    reason if given.

    A declaration is also a typed handle: ``MAX_FILES = Option[int]("maxFilesPerTrigger",
    Integer(min=1))`` then ``options[MAX_FILES]`` is an ``int`` for the type checker (string keys
    keep working, untyped). ``read_limit`` names the :class:`~headrace.protocols.ReadLimit` field
    the option sets (``"max_files"``, ``"max_bytes"``, ``"max_rows"``, ``"min_rows"``,
    ``"max_trigger_delay"``): the default ``Source.default_read_limit()`` is then derived from it.
    """

    name: str
    type: OptionType[T] = field(default_factory=String)  # type: ignore[arg-type]
    default: Any = None
    required: bool = False
    doc: str = ""
    secret: bool = False
    unsupported: str | None = None
    aliases: tuple[str, ...] = ()
    read_limit: str | None = None

    def __post_init__(self) -> None:
        if self.read_limit is not None and self.read_limit not in _READ_LIMIT_FIELDS:
            raise ValueError(f"option {self.name!r}: read_limit={self.read_limit!r} is not one of {', '.join(_READ_LIMIT_FIELDS)}")


@dataclass(frozen=True)
class PassThrough:
    """Every option starting with ``prefix`` goes to the client library as a string.

    Keys that look like credentials (``secret_markers``) are treated as secrets.
    """

    prefix: str
    doc: str = ""
    secret_markers: tuple[str, ...] = ("password", "passwd", "secret", "token", "jaas", "ssl.key", "credential",
                                       "private", "account_key", "accountkey", "api_key", "apikey")


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


class Options(Mapping[str, Any]):
    """Validated options: typed values by canonical name, looked up case-insensitively.

    Defaults fill options that were not given (``is_set`` tells them apart). Secrets are
    :class:`Secret`; pass-through options are under ``passthrough(prefix)``. The repr never shows
    a secret, so an ``Options`` can be logged.
    """

    def __init__(
        self,
        values: Mapping[str, Any],
        given: Iterable[str] = (),
        passthrough: Mapping[str, Mapping[str, Any]] | None = None,
        read_limits: Mapping[str, str] | None = None,
    ) -> None:
        self._values = dict(values)
        self._lower = {k.lower(): k for k in self._values}
        self._given = {g.lower() for g in given}
        self._passthrough = {p: dict(v) for p, v in (passthrough or {}).items()}
        self._read_limits = dict(read_limits or {})

    def read_limit(self) -> ReadLimit:
        """The :class:`~headrace.protocols.ReadLimit` set by the options declared with
        ``read_limit=...`` (unset ones leave their field None: no limit)."""
        from headrace.protocols import ReadLimit

        fields = {f: self.reveal(name) for name, f in self._read_limits.items() if self._values.get(name) is not None}
        return ReadLimit(**fields)

    def _key(self, name: str) -> str:
        try:
            return self._lower[name.lower()]
        except KeyError:
            raise KeyError(f"{name!r} is not a declared option; declared: {', '.join(sorted(self._values))}") from None

    @overload
    def __getitem__(self, name: Option[T]) -> T: ...
    @overload
    def __getitem__(self, name: str) -> Any: ...
    def __getitem__(self, name: str | Option[Any]) -> Any:
        if isinstance(name, Option):
            name = name.name
        return self._values[self._key(name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, name: object) -> bool:
        if isinstance(name, Option):
            name = name.name
        return isinstance(name, str) and name.lower() in self._lower

    def is_set(self, name: str | Option[Any]) -> bool:
        """True when the user gave this option (as opposed to its default applying)."""
        return (name.name if isinstance(name, Option) else name).lower() in self._given

    @overload
    def reveal(self, name: Option[T]) -> T: ...
    @overload
    def reveal(self, name: str) -> Any: ...
    def reveal(self, name: str | Option[Any]) -> Any:
        """The plain value of an option, secret or not (for handing to a client library)."""
        v = self[name]
        return v.reveal() if isinstance(v, Secret) else v

    def passthrough(self, prefix: str, *, strip: bool = True) -> dict[str, str]:
        """The pass-through options under ``prefix`` as plain strings, secrets revealed.

        With ``strip`` the prefix is removed from the keys (``kafka.acks`` -> ``acks``).
        """
        items = self._passthrough.get(prefix, {})
        out = {}
        for k, v in items.items():
            key = k[len(prefix):] if strip else k
            out[key] = v.reveal() if isinstance(v, Secret) else v
        return out

    def redacted(self) -> dict[str, Any]:
        """Given options (and pass-throughs) with secrets replaced by ``***``; safe to log."""
        out: dict[str, Any] = {}
        for k, v in self._values.items():
            if k.lower() in self._given:
                out[k] = "***" if isinstance(v, Secret) else v
        for items in self._passthrough.values():
            for k, v in items.items():
                out[k] = "***" if isinstance(v, Secret) else v
        return out

    def __repr__(self) -> str:
        return f"Options({self.redacted()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Options, (self._values, self._given, self._passthrough, self._read_limits))


class OptionSchema:
    """All options of one connector role (source or sink), declared once.

    ``ignore`` names options the engine consumes (``checkpointLocation``) that are accepted
    without being passed on.
    """

    def __init__(
        self,
        options: Iterable[Option] = (),
        *,
        rules: Iterable[Rule] = (),
        passthrough: Iterable[PassThrough] = (),
        ignore: Iterable[str] = (),
    ) -> None:
        self.options = list(options)
        self.rules = list(rules)
        self.passthrough = list(passthrough)
        self.ignore = {i.lower() for i in ignore}
        self._by_lower: dict[str, Option] = {}
        # defaults are written as a user would write them ("10 seconds"); parse them once here
        # so connectors always get typed values, and a bad default fails at declaration
        self._defaults: dict[str, Any] = {}
        for o in self.options:
            if o.default is not None and not o.unsupported:
                try:
                    self._defaults[o.name] = o.type.parse(o.default)
                except ValueError as e:
                    raise ValueError(f"option {o.name!r}: bad default {o.default!r}: {e}") from None
        for o in self.options:
            for n in (o.name, *o.aliases):
                if n.lower() in self._by_lower:
                    raise ValueError(f"option {n!r} is declared twice")
                self._by_lower[n.lower()] = o

    def get(self, name: str) -> Option | None:
        return self._by_lower.get(name.lower())

    def __getitem__(self, name: str) -> Option[Any]:
        """The declaration called ``name`` (or an alias of it), for a typed handle:
        ``MAX_FILES: Option[int] = SOURCE_OPTIONS["maxFilesPerTrigger"]``."""
        opt = self._by_lower.get(name.lower())
        if opt is None:
            raise KeyError(f"{name!r} is not declared; declared: {', '.join(o.name for o in self.options)}")
        return opt

    def extended(self, options: Iterable[Option] = (), *, rules: Iterable[Rule] = ()) -> OptionSchema:
        """A copy with more options and rules (e.g. a connector adding to a shared set)."""
        return OptionSchema(
            [*self.options, *options], rules=[*self.rules, *rules], passthrough=self.passthrough, ignore=self.ignore
        )

    def parse(self, raw: Mapping[str, Any], *, connector: str = "?", role: str = "connector") -> Options:
        """Validate and coerce ``raw``; raise :class:`OptionsError` listing every problem.

        Pure: no I/O. Call it before creating the source or sink.
        """
        problems: list[OptionProblem] = []
        values: dict[str, Any] = {}
        given: list[str] = []
        passthrough: dict[str, dict[str, Any]] = {p.prefix: {} for p in self.passthrough}
        seen: dict[str, str] = {}
        for key, value in raw.items():
            lower = key.lower()
            if lower in self.ignore:
                continue
            opt = self._by_lower.get(lower)
            if opt is None:
                pt = next((p for p in self.passthrough if lower.startswith(p.prefix.lower())), None)
                if pt is not None:
                    canonical = pt.prefix + key[len(pt.prefix):]
                    secret = any(m in lower for m in pt.secret_markers)
                    passthrough[pt.prefix][canonical] = Secret(str(value)) if secret else str(value)
                    continue
                hint = suggest(key, [o.name for o in self.options] + [p.prefix + "*" for p in self.passthrough])
                problems.append(OptionProblem(key, "unknown option" + (f" (did you mean {hint!r}?)" if hint else "")))
                continue
            if opt.name in seen:
                problems.append(OptionProblem(key, f"given twice (also as {seen[opt.name]!r}); give it once"))
                continue
            seen[opt.name] = key
            if opt.unsupported:
                problems.append(OptionProblem(opt.name, f"not supported by headrace: {opt.unsupported}"))
                continue
            if value is None:
                continue
            try:
                parsed = opt.type.parse(value)
            except Exception as e:  # a parser's ValueError, or anything a hostile value provokes
                detail = str(e) if isinstance(e, ValueError) else f"{_short(value)} cannot be parsed ({type(e).__name__})"
                msg = f"invalid value (hidden: secret); expected {opt.type.label}" if opt.secret else detail
                problems.append(OptionProblem(opt.name, msg))
                continue
            values[opt.name] = Secret(parsed) if opt.secret else parsed
            given.append(opt.name)
        for opt in self.options:
            if opt.name in values or opt.unsupported:
                continue
            if opt.required and opt.name not in seen:
                problems.append(OptionProblem(opt.name, "is required" + (f": {opt.doc}" if opt.doc else "")))
                continue
            values[opt.name] = self._defaults.get(opt.name)
        opts = Options(values, given, passthrough, {o.name: o.read_limit for o in self.options if o.read_limit})
        if not problems:
            for r in self.rules:
                try:
                    problems.extend(r.check(opts))
                except Exception as e:  # a rule tripping over a hostile value is still a bad value
                    problems.append(OptionProblem(r.doc, f"the options given cannot be checked ({type(e).__name__}: {str(e)[:200]})"))
        else:
            # still report cross-option problems among options that parsed
            for r in self.rules:
                try:
                    problems.extend(r.check(opts))
                except Exception:
                    continue
        if problems:
            raise OptionsError(connector, role, problems)
        return opts

    def rows(self) -> list[dict[str, str]]:
        """One row per option for documentation: name, type, default, required, doc."""
        rows = []
        for o in self.options:
            default = "" if o.default is None else o.type.render(o.default)
            rows.append(
                {
                    "name": o.name + (f" ({', '.join(o.aliases)})" if o.aliases else ""),
                    "type": o.type.label,
                    "default": "(secret)" if o.secret and default else default,
                    "required": "yes" if o.required else "",
                    "doc": (f"UNSUPPORTED: {o.unsupported}" if o.unsupported else o.doc) + (" (secret)" if o.secret else ""),
                }
            )
        for p in self.passthrough:
            rows.append({"name": p.prefix + "*", "type": "string", "default": "", "required": "", "doc": p.doc})
        return rows

    def render(self, title: str) -> str:
        """A plain-text table of the options and rules (``headrace describe``)."""
        rows = self.rows()
        cols = ["name", "type", "default", "required", "doc"]
        widths = {c: max(len(c), *(len(r[c]) for r in rows)) if rows else len(c) for c in cols[:-1]}
        lines = [title]
        if not rows:
            lines.append("  (no options)")
        else:
            header = "  " + "  ".join(c.ljust(widths[c]) for c in cols[:-1]) + "  doc"
            lines += [header, "  " + "-" * (len(header) + 10)]
            for r in rows:
                lines.append("  " + "  ".join(r[c].ljust(widths[c]) for c in cols[:-1]) + "  " + r["doc"])
        if self.rules:
            lines.append("  rules: " + "; ".join(r.doc for r in self.rules))
        return "\n".join(lines)

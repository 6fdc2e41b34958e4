"""Validated options (:class:`Options`): typed values looked up case-insensitively, secrets kept hidden.

An ``Options`` is made by :meth:`OptionSchema.parse` and handed to a connector's constructor; it
pickles (sources and sinks carry it to Spark executors) and its repr redacts every secret.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, overload

from headrace.options.declarations import Option
from headrace.options.option_types import T
from headrace.options.secrets import Secret

if TYPE_CHECKING:
    from headrace.protocols import ReadLimit

__all__ = ["Options"]

log = logging.getLogger(__name__)


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

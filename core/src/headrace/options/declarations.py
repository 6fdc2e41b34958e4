"""Declarations: one :class:`Option` (name, type, default, doc) and :class:`PassThrough` prefixes.

Declarations are built once, at import of a connector's ``_options`` module, and are frozen;
an ``Option`` is also a typed handle for looking a value up in :class:`~headrace.options.Options`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Generic

from headrace.options.option_types import OptionType, String, T
from headrace.redaction import SECRET_MARKERS

__all__ = ["Option", "PassThrough"]

log = logging.getLogger(__name__)

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
    secret_markers: tuple[str, ...] = SECRET_MARKERS

"""The exception hierarchy. Every error names the thing, the bad value and the fix.

Secret redaction is :mod:`headrace.redaction`; ``redact``, ``redact_url``, ``register_secret``,
``scrub_exception`` and ``RedactingLogRecord`` are re-exported from here for one release
(import them from :mod:`headrace.redaction`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# redaction lives in headrace.redaction; these names are re-exported here for one release
from headrace.redaction import RedactingLogRecord, redact, redact_url, register_secret, scrub_exception

__all__ = [
    "CheckpointError",
    "ConnectorNotFoundError",
    "DataLossError",
    "HeadraceError",
    "OptionProblem",
    "OptionsError",
    "PluginError",
    "SchemaChangedError",
    "RedactingLogRecord",
    "StreamingQueryException",
    "UnsupportedError",
    "redact",
    "redact_url",
    "register_secret",
    "scrub_exception",
]


class HeadraceError(Exception):
    """Base class of every error headrace raises on purpose."""


@dataclass(frozen=True)
class OptionProblem:
    """One problem with one option (or a combination of options)."""

    option: str
    message: str

    def __str__(self) -> str:
        return f"{self.option}: {self.message}"


class OptionsError(HeadraceError, ValueError):
    """Options are unknown, invalid or inconsistent. Raised before any I/O.

    Lists every problem at once; ``problems`` holds them one by one.
    """

    def __init__(self, connector: str, role: str, problems: Sequence[OptionProblem], *, hint: str | None = None) -> None:
        self.connector = connector
        self.role = role
        self.problems = list(problems)
        n = len(self.problems)
        lines = [f"invalid options for {role} '{connector}' ({n} problem{'s' if n != 1 else ''}):"]
        lines += [f"  - {p}" for p in self.problems]
        lines.append(hint if hint is not None else f"Run `headrace describe {connector}` to list its options.")
        super().__init__("\n".join(lines))


class PluginError(HeadraceError):
    """A plugin could not be loaded, or two plugins claim the same connector name."""


class ConnectorNotFoundError(PluginError, LookupError):
    """No installed plugin provides the connector asked for."""


class CheckpointError(HeadraceError):
    """The checkpoint is corrupt, belongs to another query, or is locked by a running query."""


class DataLossError(HeadraceError):
    """Data the stream needs is gone (retention, vacuum, trimmed offsets)."""


class SchemaChangedError(HeadraceError):
    """The source's schema changed while the stream was running; a restart picks it up."""


class UnsupportedError(HeadraceError):
    """A feature, option value or combination is not supported by this connector or trigger."""


class StreamingQueryException(HeadraceError):
    """A streaming query failed; ``cause`` (also ``__cause__``) is the original exception."""

    def __init__(self, query_name: str, batch_id: int | None, cause: BaseException) -> None:
        self.query_name = query_name
        self.batch_id = batch_id
        self.cause = cause
        where = f" in batch {batch_id}" if batch_id is not None else ""
        super().__init__(f"query '{query_name}' failed{where}: {type(cause).__name__}: {redact(cause)}")

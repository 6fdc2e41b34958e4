"""How the builders hold their options: merged case-insensitively (a later ``option()`` wins),
shown redacted in reprs, and ``.schema(...)`` strings parsed.

Pure helpers, called by every builder method (``option``, ``options``, ``schema``, ``__repr__``)
on the caller's thread; no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from headrace.errors import redact
from headrace.options import OptionSchema, PassThrough
from headrace.plugins import registry
from headrace.sql_types import parse_schema  # re-exported: it lives below the transforms, which use it

__all__ = ["parse_schema"]

log = logging.getLogger(__name__)


def _merge(base: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    lower = {k.lower(): k for k in out}
    for k, v in new.items():
        if k.lower() in lower:
            del out[lower[k.lower()]]
        out[k] = v
        lower[k.lower()] = k
    return out



def _schema_of(fmt: str | None, role: str) -> OptionSchema | None:
    """The connector's option schema for ``role``, or None (unknown connector: never raises)."""
    if not fmt:
        return None
    try:
        spec = registry().get(fmt)
    except Exception:
        return None
    return spec.source_options if role == "source" else spec.sink_options


def _redacted_options(options: Mapping[str, Any], schema: OptionSchema | None) -> dict[str, Any]:
    """Options as a repr may show them: secret options (declared ``secret=True``, pass-through
    keys that look like credentials, or any key that looks like one when the connector is
    unknown) as ``***``, callables by name, credentials inside URLs redacted."""
    markers = PassThrough("").secret_markers
    out: dict[str, Any] = {}
    for k, v in options.items():
        lower = k.lower()
        opt = schema.get(k) if schema is not None else None
        if opt is not None:
            secret = opt.secret
        else:
            pt = next((p for p in schema.passthrough if lower.startswith(p.prefix.lower())), None) if schema else None
            secret = any(m in lower for m in (pt.secret_markers if pt is not None else markers)) or (
                "url" in lower and schema is None
            )
        if secret:
            out[k] = "***"
        elif callable(v):
            out[k] = f"<function {getattr(v, '__qualname__', type(v).__name__)}>"
        else:
            out[k] = redact(v) if isinstance(v, str) else v
    return out

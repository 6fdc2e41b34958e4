"""How option values and names appear in messages: a value cut short, a did-you-mean.

Pure functions, called while options are parsed (once per ``load()``/``start()``, on the driver).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable
from typing import Any

__all__ = ["suggest"]

log = logging.getLogger(__name__)


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

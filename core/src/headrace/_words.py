"""Counts in messages people read: ``counted(1, "batch")`` is ``1 batch``, ``counted(2, "batch")``
is ``2 batches`` (thousands separated: ``1,000 rows``)."""

from __future__ import annotations

__all__ = ["counted", "plural"]


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``noun`` for one, its plural otherwise (``many``, or ``-es`` after s, x, ch, sh, else ``-s``)."""
    if n == 1:
        return noun
    if many is not None:
        return many
    return noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s")


def counted(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and the noun in the right number: ``1 row``, ``2 rows``, ``1,000 batches``."""
    return f"{n:,} {plural(n, noun, many)}"

"""Column type changes seen by the change source: which ones are widenings.

A relation message (pgoutput) carries each column's type oid and typmod. When they differ from
the stream's column (read from the catalog when the query started), the change is either a
**widening** — every value of the old type is a value of the new one, with the same text:
``smallint`` -> ``integer`` -> ``bigint``, ``real`` -> ``double precision``, ``varchar(n)`` ->
``varchar(m >= n)`` / ``text``, ``numeric(p, s)`` -> ``numeric(p2, s2)`` with ``s2 >= s`` and
``p2 - s2 >= p - s`` — or anything else. Pure functions, no I/O.
"""

from __future__ import annotations

__all__ = ["describe_type", "is_widening"]

_INT_RANK = {21: 0, 23: 1, 20: 2}  # smallint, integer, bigint
_FLOAT_RANK = {700: 0, 701: 1}  # real, double precision
_VARCHAR, _TEXT, _NUMERIC = 1043, 25, 1700
_NAMES = {21: "smallint", 23: "integer", 20: "bigint", 700: "real", 701: "double precision", 25: "text",
          16: "boolean", 17: "bytea", 1082: "date", 1114: "timestamp", 1184: "timestamptz", 1083: "time",
          1186: "interval", 114: "json", 3802: "jsonb", 2950: "uuid", 1042: "character"}  # fmt: skip


def _numeric(typmod: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a constrained numeric; None when unconstrained."""
    if typmod < 4:
        return None
    return ((typmod - 4) >> 16) & 0xFFFF, (typmod - 4) & 0xFFFF


def describe_type(oid: int, typmod: int) -> str:
    """A column type as PostgreSQL prints it (``integer``, ``varchar(20)``, ``numeric(10,2)``),
    or ``type oid N`` for a type this module does not name."""
    if oid == _VARCHAR:
        return f"varchar({typmod - 4})" if typmod >= 4 else "varchar"
    if oid == _NUMERIC:
        ps = _numeric(typmod)
        return f"numeric({ps[0]},{ps[1]})" if ps else "numeric"
    return _NAMES.get(oid, f"type oid {oid}")


def is_widening(old_oid: int, old_typmod: int, new_oid: int, new_typmod: int) -> bool:
    """Whether a column of type ``(old_oid, old_typmod)`` changed to ``(new_oid, new_typmod)``
    holds every old value unchanged (the same type is not a widening)."""
    if (old_oid, old_typmod) == (new_oid, new_typmod):
        return False
    if old_oid in _INT_RANK and new_oid in _INT_RANK:
        return _INT_RANK[new_oid] > _INT_RANK[old_oid]
    if old_oid in _FLOAT_RANK and new_oid in _FLOAT_RANK:
        return _FLOAT_RANK[new_oid] > _FLOAT_RANK[old_oid]
    if old_oid == _VARCHAR:
        if new_oid == _TEXT:
            return True
        if new_oid == _VARCHAR:
            return new_typmod < 0 or (0 <= old_typmod <= new_typmod)
        return False
    if old_oid == _NUMERIC and new_oid == _NUMERIC:
        old, new = _numeric(old_typmod), _numeric(new_typmod)
        if old is None or new is None:
            return False  # unconstrained numeric is text in the stream: not the same Arrow type
        return new[1] >= old[1] and new[0] - new[1] >= old[0] - old[1]
    return False

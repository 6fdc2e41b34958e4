"""Within one chunk: the last row of each key, sorted by key.

Collapsing duplicates means ``ON CONFLICT DO UPDATE`` never meets the same key twice in one
statement (which PostgreSQL rejects), and sorting means concurrent writers lock rows in the
same order, so they cannot deadlock on each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.helpers.auto_cdc import first_of_each_key

__all__ = ["last_per_key_sorted"]

_POS = "__headrace_pos"


def last_per_key_sorted(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``table`` sorted by ``keys`` (ascending) with only the last row (in input order) of
    each key. Called once per flushed chunk; O(n log n) in the chunk's rows."""
    n = table.num_rows
    if n <= 1:
        return table
    with_pos = table.append_column(_POS, pa.array(np.arange(n, dtype=np.int64)))
    order = pc.sort_indices(with_pos, sort_keys=[*((k, "ascending") for k in keys), (_POS, "descending")])
    return first_of_each_key(table.take(order), keys)

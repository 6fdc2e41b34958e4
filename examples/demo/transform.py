"""The demo's transform: add a VAT-inclusive amount and a size bucket (pyarrow.Table -> Table)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def enrich(table: pa.Table) -> pa.Table:
    amount = table.column("amount")
    gross = pc.round(pc.multiply(amount, 1.21), 2)
    bucket = pc.if_else(pc.greater(amount, 250), "large", "small")
    return table.append_column("amount_gross", gross).append_column("size", bucket)

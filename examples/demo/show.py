"""Print what the demo's Delta table holds.  python examples/demo/show.py TABLE_PATH"""

from __future__ import annotations

import sys

import pyarrow.compute as pc
from deltalake import DeltaTable


def main() -> None:
    dt = DeltaTable(sys.argv[1])
    table = dt.to_pyarrow_table()
    print(f"Delta table {sys.argv[1]}: version {dt.version()}, {table.num_rows:,} rows, "
          f"{len(set(table.column('order_id').to_pylist())):,} distinct order ids")  # fmt: skip
    by_country = table.group_by("country").aggregate([("amount_gross", "sum")]).sort_by("country")
    for row in by_country.to_pylist():
        print(f"  {row['country']}: {row['amount_gross_sum']:,.2f}")
    print("  large orders:", pc.sum(pc.equal(table.column("size"), "large")).as_py())


if __name__ == "__main__":
    main()

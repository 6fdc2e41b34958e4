"""``merge``: an idempotent upsert of a micro-batch into a Delta table, for ``foreach_batch``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import HeadraceError
from headrace_delta._storage import normalize_uri

__all__ = ["merge"]


def _dedupe_last(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Keep the last row of each key (a MERGE source must not match a target row twice)."""
    if table.num_rows <= 1:
        return table
    idx = pa.array(range(table.num_rows), pa.int64())
    grouped = table.select(list(keys)).append_column("__row", idx).group_by(list(keys), use_threads=False)
    last = grouped.aggregate([("__row", "max")]).column("__row_max")
    return table.take(last.take(pc.sort_indices(last)))


def merge(
    table_uri: str,
    source_table: pa.Table,
    *,
    keys: Sequence[str],
    batch_id: int,
    app_id: str,
    storage_options: dict[str, str] | None = None,
    partition_by: Sequence[str] | None = None,
    user_metadata: str | None = None,
) -> bool:
    """Upsert ``source_table`` into the Delta table at ``table_uri`` on ``keys``: matching rows
    are updated (all columns), others inserted. Creates the table on first use.

    Idempotent: the commit carries the app transaction ``(app_id, batch_id)``, and a batch
    whose transaction is already in the log is skipped, so replaying a batch after a crash
    changes nothing. Rows with the same key keep the last one. Returns False when skipped.

    Call it from a ``foreach_batch`` function, once per batch::

        def upsert(table, batch_id):
            headrace_delta.merge("/data/users", table, keys=["id"], batch_id=batch_id, app_id="users-upsert")
    """
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    if not keys:
        raise HeadraceError("merge needs at least one key column, e.g. keys=['id']")
    missing = [k for k in keys if k not in source_table.column_names]
    if missing:
        raise HeadraceError(
            f"merge keys {missing} are not columns of the batch; its columns: {', '.join(source_table.column_names)}"
        )
    uri = normalize_uri(table_uri)
    meta = {"userMetadata": user_metadata} if user_metadata is not None else None
    props = CommitProperties(app_transactions=[Transaction(app_id, int(batch_id))], custom_metadata=meta)
    source = _dedupe_last(source_table, keys)
    if not DeltaTable.is_deltatable(uri, storage_options=storage_options):
        write_deltalake(uri, source, mode="append", partition_by=list(partition_by) if partition_by else None,
                        storage_options=storage_options, commit_properties=props)  # fmt: skip
        return True
    dt = DeltaTable(uri, storage_options=storage_options)
    done = dt.transaction_version(app_id)
    if done is not None and done >= batch_id:
        return False
    predicate = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
    builder: Any = dt.merge(source, predicate=predicate, source_alias="s", target_alias="t", commit_properties=props)
    builder.when_matched_update_all().when_not_matched_insert_all().execute()
    return True

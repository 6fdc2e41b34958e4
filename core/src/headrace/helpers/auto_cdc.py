"""AUTO CDC: applying a change stream to a keyed table, with Lakeflow's option names.

Shared by the sinks that apply changes (``delta`` with ``storedAsScdType`` 1 or 2, ``lakebase``)
and by ``dp.create_auto_cdc_flow``. A change stream has one row per event, with key columns,
a sequence column (``sequenceBy``) ordering the events of one key, and a condition
(``applyAsDeletes``, SQL evaluated by DuckDB) marking deletes. Rows whose ``_change_type`` is
``update_preimage`` are ignored (the Delta change feed and the PostgreSQL change source send a
pre- and a post-image for each update; only the post-image is applied).

:func:`prepare` turns one Arrow table of events into the rows to apply: the output columns
(``columnList`` / ``exceptColumnList``) plus two hidden columns, :data:`SEQ` (the sequence) and
:data:`DELETE` (the delete flag). :func:`last_per_key` keeps the latest event of each key, for
SCD type 1. Nothing here does I/O; DuckDB is imported only when ``applyAsDeletes`` is set.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from headrace.errors import HeadraceError, OptionProblem
from headrace.options import Option, Options, String, StringList, at_most_one_of, rule

__all__ = [
    "AUTO_CDC_OPTIONS",
    "AUTO_CDC_RULES",
    "CHANGE_TYPE",
    "DELETE",
    "SEQ",
    "AutoCdcError",
    "AutoCdcSpec",
    "first_of_each_key",
    "last_per_key",
    "delete_mask",
    "prepare",
    "release_sql",
    "sort_events",
]

CHANGE_TYPE = "_change_type"
SEQ = "__headrace_seq"
"""Hidden column of :func:`prepare`'s output: the event's sequence value."""
DELETE = "__headrace_delete"
"""Hidden column of :func:`prepare`'s output: True when the event is a delete."""
_POS = "__headrace_pos"


class AutoCdcError(HeadraceError):
    """The change stream does not fit the AUTO CDC options (missing key or sequence column...)."""


AUTO_CDC_OPTIONS = [
    Option(
        "sequenceBy",
        String(),
        doc="AUTO CDC: the column ordering the events of one key (e.g. _lsn, _commit_version, a timestamp). "
        "Out-of-order events are resolved by it: the highest wins. Unset, the stream's order decides (the last "
        "event of a key in the batch wins). Setting it (or applyAsDeletes) applies the stream as changes instead of "
        "appending/upserting rows.",
    ),
    Option(
        "applyAsDeletes",
        String(),
        doc="AUTO CDC: a SQL condition marking delete events, e.g. \"_change_type = 'delete'\" (DuckDB SQL over "
        "the batch; needs headrace[sql]).",
    ),
    Option(
        "columnList",
        StringList(min_items=1),
        doc="AUTO CDC: the columns to write to the target (keys are always written).",
    ),
    Option(
        "exceptColumnList",
        StringList(min_items=1),
        doc="AUTO CDC: the columns not to write to the target, e.g. '_change_type,_commit_version,_commit_timestamp'.",
    ),
]
"""The AUTO CDC options a sink adds to its schema (with its own ``keys``)."""


@rule("columnList and exceptColumnList apply only to AUTO CDC")
def _cdc_only(opts: Options) -> list[OptionProblem]:
    if (opts.is_set("columnList") or opts.is_set("exceptColumnList")) and not (
        opts.is_set("sequenceBy") or opts.is_set("applyAsDeletes")
    ):
        name = "columnList" if opts.is_set("columnList") else "exceptColumnList"
        return [OptionProblem(name, "applies only to AUTO CDC: set sequenceBy (and applyAsDeletes) as well")]
    return []


AUTO_CDC_RULES = [at_most_one_of("columnList", "exceptColumnList"), _cdc_only]


@dataclass(frozen=True)
class AutoCdcSpec:
    """AUTO CDC settings of one sink. ``enabled`` when ``sequenceBy`` or ``applyAsDeletes`` is set."""

    keys: tuple[str, ...]
    sequence_by: str | None = None
    apply_as_deletes: str | None = None
    column_list: tuple[str, ...] | None = None
    except_column_list: tuple[str, ...] | None = None

    @property
    def enabled(self) -> bool:
        return self.sequence_by is not None or self.apply_as_deletes is not None

    @classmethod
    def from_options(cls, opts: Options, keys: Sequence[str] | None) -> AutoCdcSpec:
        """Read the options (``keys`` given by the sink: its own key option)."""
        return cls(
            keys=tuple(keys or ()),
            sequence_by=opts["sequenceBy"],
            apply_as_deletes=opts["applyAsDeletes"],
            column_list=tuple(opts["columnList"]) if opts["columnList"] else None,
            except_column_list=tuple(opts["exceptColumnList"]) if opts["exceptColumnList"] else None,
        )

    def output_columns(self, names: Sequence[str]) -> list[str]:
        """The target's columns for input columns ``names``: keys first-class, then
        ``columnList`` (in its order) or every column not in ``exceptColumnList``."""
        missing = [k for k in self.keys if k not in names]
        if missing:
            raise AutoCdcError(
                f"AUTO CDC: key column(s) {', '.join(missing)} are not in the change stream (columns: {', '.join(names)}); "
                "fix the keys option or the stream"
            )
        if self.column_list is not None:
            unknown = [c for c in self.column_list if c not in names]
            if unknown:
                raise AutoCdcError(
                    f"AUTO CDC: columnList names {', '.join(unknown)}, not in the change stream (columns: {', '.join(names)})"
                )
            cols = [c for c in self.column_list if c not in self.keys]
            return [*self.keys, *cols]
        drop = set(self.except_column_list or ())
        unknown = [c for c in drop if c not in names]
        if unknown:
            raise AutoCdcError(
                f"AUTO CDC: exceptColumnList names {', '.join(sorted(unknown))}, not in the change stream "
                f"(columns: {', '.join(names)})"
            )
        bad = [k for k in self.keys if k in drop]
        if bad:
            raise AutoCdcError(f"AUTO CDC: exceptColumnList cannot drop the key column(s) {', '.join(bad)}")
        return [n for n in names if n not in drop]


def prepare(table: pa.Table, spec: AutoCdcSpec, position: int = 0) -> pa.Table:
    """One batch of events as rows to apply: ``update_preimage`` rows dropped, the output
    columns, then :data:`SEQ` and :data:`DELETE`. Row order is kept (the stream's order breaks
    ties between events of equal sequence). Called by a sink once per record batch of its input.

    Without ``sequenceBy`` the sequence is the stream order: the events' positions in the sink's
    input, ``position`` for the first row of ``table``, so a sink that prepares its input in
    several parts passes the number of rows it prepared before (``position + num_rows`` of the
    previous output), and the last event of a key in the stream wins."""
    import numpy as np  # with the sql extra; imported when a change stream is applied
    import pyarrow.compute as pc  # ~50 ms: not at import (plugins' option modules import this one at query start)

    if CHANGE_TYPE in table.column_names and table.num_rows:
        keep = pc.fill_null(pc.not_equal(table[CHANGE_TYPE], "update_preimage"), True)
        if not pc.all(keep).as_py():
            table = table.filter(keep)
    cols = spec.output_columns(table.column_names)
    if spec.sequence_by is not None:
        if spec.sequence_by not in table.column_names:
            raise AutoCdcError(
                f"AUTO CDC: sequenceBy column {spec.sequence_by!r} is not in the change stream "
                f"(columns: {', '.join(table.column_names)})"
            )
        seq = table[spec.sequence_by]
    else:
        seq = pa.chunked_array([pa.array(np.arange(position, position + table.num_rows, dtype=np.int64))])
    if spec.apply_as_deletes is not None and table.num_rows:
        deletes = delete_mask(table, spec.apply_as_deletes)
    else:
        deletes = pa.chunked_array([pa.array(np.zeros(table.num_rows, dtype=bool))])
    out = table.select(cols)
    return out.append_column(SEQ, seq).append_column(DELETE, deletes.cast(pa.bool_()))


_SIMPLE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*'([^']*)'\s*")


def delete_mask(table: pa.Table, condition: str) -> pa.ChunkedArray:
    """``applyAsDeletes`` evaluated on every row (NULL is false): ``column = 'literal'`` directly
    with Arrow, any other condition with DuckDB (``condition_mask``)."""
    import pyarrow.compute as pc  # ~50 ms: not at import (plugins' option modules import this one at query start)

    m = _SIMPLE.fullmatch(condition)
    if m and m.group(1) in table.column_names and pa.types.is_string(table.schema.field(m.group(1)).type):
        return pc.fill_null(pc.equal(table[m.group(1)], m.group(2)), False)
    from headrace.transforms.expressions import condition_mask

    return condition_mask(table, condition)


def release_sql() -> None:
    """Close this thread's DuckDB cursor, if any. Sinks call it from ``close`` (the thread
    that ran their writes): a DuckDB connection destroyed while the interpreter exits, in a
    daemon thread, aborts the process."""
    from headrace.transforms.expressions import release_thread

    release_thread()


def last_per_key(prepared: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The latest event of each key of a :func:`prepare` output (highest :data:`SEQ`; among
    equal sequences a non-delete before a delete, then the last in stream order), sorted by
    key. O(n log n)."""
    import numpy as np  # with the sql extra; imported when a change stream is applied
    import pyarrow.compute as pc  # ~50 ms: not at import (plugins' option modules import this one at query start)

    n = prepared.num_rows
    if n <= 1:
        return prepared
    if prepared[SEQ].null_count:
        raise AutoCdcError(f"AUTO CDC: the sequenceBy column has NULL values in {prepared[SEQ].null_count} rows; "
                           "every event needs a sequence value")  # fmt: skip
    with_pos = prepared.append_column(_POS, pa.array(np.arange(n, dtype=np.int64)))
    # among events of equal sequence (a Delta commit that rewrote a file without change data files
    # reports the row's delete and its new insert with one version), the non-delete wins
    order = pc.sort_indices(
        with_pos,
        sort_keys=[*((k, "ascending") for k in keys), (SEQ, "descending"), (DELETE, "ascending"), (_POS, "descending")],
    )
    return first_of_each_key(prepared.take(order), keys)


def first_of_each_key(ordered: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The first row of each run of equal ``keys`` in ``ordered`` (a table sorted by them;
    NULL keys compare unequal to their neighbours). Called once per batch or flushed chunk
    by AUTO CDC and upsert sinks; O(n) in its rows."""
    import numpy as np  # with the sql extra; imported when a change stream is applied
    import pyarrow.compute as pc

    n = ordered.num_rows
    if n <= 1:
        return ordered
    keep = np.zeros(n, dtype=bool)
    keep[0] = True
    for k in keys:
        col = ordered.column(k).combine_chunks()
        differs = pc.not_equal(col.slice(1), col.slice(0, n - 1)).fill_null(True)
        keep[1:] |= differs.to_numpy(zero_copy_only=False)
    return ordered if keep.all() else ordered.filter(pa.array(keep))


def sort_events(prepared: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Events sorted by key, then sequence, then stream order (for SCD type 2 history)."""
    import numpy as np  # with the sql extra; imported when a change stream is applied
    import pyarrow.compute as pc  # ~50 ms: not at import (plugins' option modules import this one at query start)

    n = prepared.num_rows
    if n <= 1:
        return prepared
    with_pos = prepared.append_column(_POS, pa.array(np.arange(n, dtype=np.int64)))
    order = pc.sort_indices(
        with_pos,
        sort_keys=[*((k, "ascending") for k in keys), (SEQ, "ascending"), (DELETE, "descending"), (_POS, "ascending")],
    )
    return prepared.take(order)

"""Reading the files of one partition into record batches of the stream's schema.

Everything :func:`read_partition` needs travels in the partition (:class:`ReadPlan` and the
file list), so it runs the same in an engine thread or on a pickled copy elsewhere.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.errors import HeadraceError, SchemaChangedError
from headrace.helpers.badrecords import BadRecord, BadRecords
from headrace.protocols import Partition
from headrace_cloudfiles.conform import MALFORMED_KEY, Conformed, _cast_one, conform_rows, conform_table
from headrace_cloudfiles.formats import CorruptFileError, ReaderConfig, parse_file
from headrace_cloudfiles.index import IndexedFile
from headrace_cloudfiles.schemas import SchemaStore
from headrace_cloudfiles.storage import Store

__all__ = ["FilesPartition", "ReadPlan", "partition_values", "read_partition"]

log = logging.getLogger(__name__)

_COALESCE_ROWS = 65_536
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def partition_values(rel: str) -> dict[str, str | None]:
    """The ``key=value`` folders of a relative path (``a=1/b=x/f.json`` -> ``{a: 1, b: x}``)."""
    out: dict[str, str | None] = {}
    for part in rel.split("/")[:-1]:
        key, eq, value = part.partition("=")
        if eq and key:
            out[key] = None if value == HIVE_NULL else value
    return out


@dataclass(frozen=True)
class ReadPlan:
    """How to read files into the stream's schema. Built once per run; picklable.

    ``schema`` is the output: ``data`` columns, then ``partitions`` columns, then the rescued
    data column (when ``rescue_column``).
    """

    store: Store
    config: ReaderConfig
    schema: pa.Schema
    data: pa.Schema
    partitions: pa.Schema
    rescue_column: str | None
    evolution_mode: str
    schema_location: str | None
    ignore_missing: bool
    ignore_corrupt: bool
    fixed: bool
    bad_records: BadRecords | None = None  # badRecordsPolicy drop / deadLetter / fail (headrace.badrecords)


@dataclass(frozen=True)
class FilesPartition(Partition):
    """Some files of a batch, in sequence order, and how to read them. Picklable."""

    plan: ReadPlan
    files: tuple[IndexedFile, ...]


def _new_column_error(plan: ReadPlan, uri: str, fields: list[pa.Field]) -> HeadraceError:
    names = ", ".join(repr(f.name) for f in fields)
    if plan.evolution_mode == "addNewColumns" and plan.schema_location:
        store = SchemaStore(plan.schema_location)
        typed = [
            f if plan.config.typed or plan.config.key in ("parquet", "avro") else pa.field(f.name, pa.string())
            for f in fields
        ]
        typed = [pa.field(f.name, pa.string()) if pa.types.is_large_string(f.type) else f for f in typed]
        version, _added = store.add_columns(typed, f"new column(s) {names} in {uri}")
        return SchemaChangedError(
            f"new column(s) {names} found in {uri}; cloudFiles.schemaEvolutionMode=addNewColumns stored them in "
            f"schema version {version.version} at {store.folder}. Restart the query to continue with them "
            "(the batch is read again with the new schema)"
        )
    return SchemaChangedError(
        f"new column(s) {names} found in {uri} and cloudFiles.schemaEvolutionMode=failOnNewColumns; fix: add them "
        "with cloudFiles.schemaHints (or .schema()), or set schemaEvolutionMode to addNewColumns or rescue"
    )


def _concat(a: Conformed, b: Conformed, data: pa.Schema) -> Conformed:
    cols = {f.name: pa.chunked_array([*_chunks(a.columns[f.name]), *_chunks(b.columns[f.name])], f.type) for f in data}
    out = Conformed(cols, a.num_rows + b.num_rows, None, [*a.new_fields, *b.new_fields])
    if a.rescued is not None or b.rescued is not None:
        out.rescued = (a.rescued or [None] * a.num_rows) + (b.rescued or [None] * b.num_rows)
    return out


def _chunks(col: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return list(col.chunks) if isinstance(col, pa.ChunkedArray) else [col]


def _read_file(plan: ReadPlan, f: IndexedFile) -> pa.Table | None:
    store = plan.store
    uri = store.uri(f.rel)
    try:
        parsed = parse_file(store, f.rel, f.size, f.mtime_ms, plan.config, plan.data)
    except FileNotFoundError:
        if plan.ignore_missing:
            log.warning("cloudFiles: skipping %s: it was deleted after it was listed (ignoreMissingFiles)", uri)
            return None
        raise HeadraceError(
            f"file {uri} was listed but is gone now; restore it, or set ignoreMissingFiles=true to skip missing files"
        ) from None
    except CorruptFileError as e:
        if plan.ignore_corrupt:
            log.warning("cloudFiles: skipping corrupt file %s (ignoreCorruptFiles): %s", uri, e)
            return None
        raise HeadraceError(f"cannot read {e}; fix or remove the file, or set ignoreCorruptFiles=true to skip it") from e
    rescue = plan.rescue_column is not None
    # with a bad-record policy, malformed records and values that do not cast are found through
    # the rescue machinery, then taken out of the file's rows
    find_bad = plan.bad_records is not None and not plan.fixed
    if plan.fixed:
        assert parsed.table is not None
        n = parsed.table.num_rows
        columns: dict[str, Any] = {name: parsed.table.column(name) for name in plan.data.names}
        rescued: list[dict[str, Any] | None] | None = None
    else:
        if parsed.table is not None:
            c = conform_table(parsed.table, plan.data, rescue=rescue or find_bad)
        else:
            c = conform_rows(parsed.rows or [], parsed.malformed or [], plan.data, rescue=rescue or find_bad)
        if parsed.extra_malformed:
            bad = conform_rows([None] * len(parsed.extra_malformed), list(parsed.extra_malformed), plan.data,
                               rescue=rescue or find_bad)  # fmt: skip
            c = _concat(c, bad, plan.data)
        if find_bad:
            assert plan.bad_records is not None
            c = _take_out_bad(c, plan, uri, parsed.malformed or [], list(parsed.extra_malformed or []),
                              parsed.rows or [], keep_rescued=rescue)  # fmt: skip
        new = [nf for nf in c.new_fields if nf.name not in plan.partitions.names and nf.name != plan.rescue_column]
        if new and plan.evolution_mode in ("addNewColumns", "failOnNewColumns"):
            raise _new_column_error(plan, uri, new)
        n, columns, rescued = c.num_rows, dict(c.columns), c.rescued
        if not rescue and not find_bad and ((parsed.malformed and any(m is not None for m in parsed.malformed)) or parsed.extra_malformed):
            log.warning("cloudFiles: %s has malformed records, read as rows of nulls (no rescued data column)", uri)
    if plan.partitions.names:
        values = partition_values(f.rel)
        for pf in plan.partitions:
            ok, v = _cast_one(values.get(pf.name), pf.type)
            if not ok and rescue:
                if rescued is None:
                    rescued = [None] * n
                for i in range(n):
                    rescued[i] = {**(rescued[i] or {}), pf.name: values.get(pf.name)}
            columns[pf.name] = pa.nulls(n, pf.type) if v is None else pa.array([v] * n, pf.type)
    if plan.rescue_column is not None:
        if rescued is None:
            columns[plan.rescue_column] = pa.nulls(n, pa.string())
        else:
            columns[plan.rescue_column] = pa.array(
                [None if r is None else json.dumps({**r, "_file_path": uri}, separators=(",", ":"), default=str)
                 for r in rescued],
                pa.string(),
            )  # fmt: skip
    arrays = [columns[name] for name in plan.schema.names]
    return pa.Table.from_arrays(arrays, schema=plan.schema)


def _take_out_bad(c: Conformed, plan: ReadPlan, uri: str, malformed: Sequence[str | None], extra: list[str],
                  rows: Sequence[dict[str, Any] | None], *, keep_rescued: bool) -> Conformed:  # fmt: skip
    """Report the rows of ``c`` that are malformed or have a value that does not cast to the
    schema (``plan.bad_records``) and return ``c`` without them."""
    assert plan.bad_records is not None
    texts = [*malformed, *extra]
    data_names = set(plan.data.names)
    bad: list[BadRecord] = []
    keep = [True] * c.num_rows
    for i, r in enumerate(c.rescued or []):
        if not r:
            continue
        if MALFORMED_KEY in r:
            text = texts[i] if i < len(texts) and texts[i] is not None else str(r[MALFORMED_KEY])
            bad.append(BadRecord(f"{uri}#record={i}", f"malformed {plan.config.fmt} record", text))
        else:
            failed = [k for k in r if k in data_names]
            if not failed:
                continue  # only fields of new columns: schema evolution's business, not a bad record
            what = ", ".join(f"{k}={r[k]!r} is not {plan.data.field(k).type}" for k in failed)
            whole = rows[i] if i < len(rows) and rows[i] is not None else r
            bad.append(BadRecord(f"{uri}#record={i}", f"value does not convert: {what}", json.dumps(whole, default=str)))
        keep[i] = False
    plan.bad_records.add(bad)  # raises for badRecordsPolicy=fail
    if not bad:
        return c if keep_rescued else Conformed(c.columns, c.num_rows, None, c.new_fields)
    import pyarrow.compute as pc  # not at module level: Spark's per-query source runner imports this module

    mask = pa.array(keep)
    cols = {k: pc.filter(v, mask) for k, v in c.columns.items()}
    rescued = [r for r, k in zip(c.rescued or [], keep, strict=True) if k] if keep_rescued and c.rescued else None
    return Conformed(cols, sum(keep), rescued, c.new_fields)


def read_partition(partition: FilesPartition) -> Iterator[pa.RecordBatch]:
    """Read every file of ``partition`` in order, yielding record batches of ``plan.schema``.

    Small files are coalesced into batches of about 64k rows. Raises naming the file when a
    file is missing or corrupt (unless ignored), and SchemaChangedError on a new column in
    addNewColumns / failOnNewColumns mode."""
    plan = partition.plan
    pending: list[pa.Table] = []
    rows = 0
    for f in partition.files:
        table = _read_file(plan, f)
        if table is None or table.num_rows == 0:
            continue
        if table.num_rows >= _COALESCE_ROWS and not pending:
            yield from table.to_batches()
            continue
        pending.append(table)
        rows += table.num_rows
        if rows >= _COALESCE_ROWS:
            yield from pa.concat_tables(pending).combine_chunks().to_batches()
            pending, rows = [], 0
    if pending:
        yield from pa.concat_tables(pending).combine_chunks().to_batches()

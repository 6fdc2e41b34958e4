"""rate-micro-batch: every row's value and timestamp, whatever the chunk and batch sizes, and
columns built in pooled memory reused once free (no per-batch allocation: see
docs/decisions.md#engine, "Column memory is pooled", and headrace._buffers)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from headrace.connectors.rate import _CHUNK, RangePartition, RateMicroBatchSource
from headrace.plugins import registry
from headrace.protocols import SourceContext


def source(per_batch: int, advance: int = 1000, start: int = 0) -> RateMicroBatchSource:
    spec = registry().get("rate-micro-batch")
    opts = spec.source_options.parse(
        {"rowsPerBatch": per_batch, "advanceMillisPerBatch": advance, "startTimestamp": start}
    )
    src = spec.load_source()(opts, SourceContext())
    assert isinstance(src, RateMicroBatchSource)
    return src


@pytest.mark.parametrize(
    ("per_batch", "advance", "start", "lo", "hi"),
    [
        pytest.param(65536, 1000, 0, 0, 65536, id="one-full-chunk-one-batch"),
        pytest.param(65536, 1000, 0, 65530, 65540, id="chunk-across-two-batches"),
        pytest.param(1000, 7, 123, 100, 70000, id="chunks-across-many-batches"),
        pytest.param(3, 1, 5, 5, 6, id="one-row"),
        pytest.param(10, 2, 0, 7, 9000, id="small-column-many-batches"),
        pytest.param(1 << 20, 1, 0, 0, 1 << 20, id="batch-of-16-chunks"),
    ],
)
def test_every_row_has_its_value_and_timestamp(per_batch: int, advance: int, start: int, lo: int, hi: int) -> None:
    batches = list(source(per_batch, advance, start).read(RangePartition(lo, hi)))
    for b in batches:
        b.validate(full=True)
        assert b.num_rows <= _CHUNK
    ts = np.concatenate([b.column("timestamp").cast(pa.int64()).to_numpy() for b in batches])
    values = np.concatenate([b.column("value").to_numpy() for b in batches])
    rows = np.arange(lo, hi, dtype=np.int64)
    assert (values == rows).all()
    assert (ts == (start + rows // per_batch * advance) * 1000).all()


def test_chunks_reuse_memory_only_once_it_is_free() -> None:
    """A chunk's columns live in pooled memory (headrace._buffers): a chunk still in use keeps
    its values while later chunks are read; once dropped, its memory serves a later chunk."""
    src = source(65536)
    first = next(iter(src.read(RangePartition(0, _CHUNK))))
    addresses = {first.column(i).buffers()[1].address for i in range(2)}
    second = next(iter(src.read(RangePartition(_CHUNK, 2 * _CHUNK))))
    assert addresses.isdisjoint(second.column(i).buffers()[1].address for i in range(2))
    assert first.column("value").to_numpy()[[0, -1]].tolist() == [0, _CHUNK - 1]
    del first
    third = next(iter(src.read(RangePartition(2 * _CHUNK, 3 * _CHUNK))))
    assert {third.column(i).buffers()[1].address for i in range(2)} == addresses
    assert second.column("value").to_numpy()[[0, -1]].tolist() == [_CHUNK, 2 * _CHUNK - 1]
    assert third.column("value").to_numpy()[[0, -1]].tolist() == [2 * _CHUNK, 3 * _CHUNK - 1]

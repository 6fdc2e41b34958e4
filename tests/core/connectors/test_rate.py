"""rate-micro-batch: every row's value and timestamp, whatever the chunk and batch sizes, and
columns built in Arrow's memory pool (no per-batch numpy temporaries: see docs/performance.md,
"the slow mode was page faults")."""

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


def test_a_full_chunk_lives_in_arrows_pool() -> None:
    """Both 512 KiB columns of a 64k-row chunk come from Arrow's memory pool (which keeps its
    pages between batches), not from numpy (glibc), and no temporary is left behind."""
    src = source(65536)
    before = pa.total_allocated_bytes()
    batch = next(iter(src.read(RangePartition(0, _CHUNK))))
    assert pa.total_allocated_bytes() - before >= 2 * _CHUNK * 8
    del batch
    assert pa.total_allocated_bytes() - before < _CHUNK * 8

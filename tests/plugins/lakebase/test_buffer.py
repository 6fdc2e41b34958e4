"""The chunk buffer: size and age cuts, positions for replays, bounded memory (no server)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa

from headrace_lakebase.buffer import ChunkBuffer


def rows(lo: int, hi: int) -> pa.RecordBatch:
    return pa.record_batch({"v": pa.array(range(lo, hi), pa.int64())})


def test_cuts_full_chunks_in_order_with_positions() -> None:
    buf = ChunkBuffer(batch_size=4, interval=60, max_ready=100)
    buf.add(rows(0, 6))
    buf.add(rows(6, 10))
    buf.close()
    chunks = []
    while (c := buf.next_chunk()) is not None:
        chunks.append(c)
    assert [(c.number, c.row_start, c.row_end) for c in chunks] == [(0, 0, 4), (1, 4, 8), (2, 8, 10)]
    values = [v for c in chunks for b in c.batches for v in b.column(0).to_pylist()]
    assert values == list(range(10))


def test_skips_rows_already_written_and_continues_numbering() -> None:
    buf = ChunkBuffer(batch_size=4, interval=60, skip=5, first_chunk=2)
    buf.add(rows(0, 3))
    buf.add(rows(3, 9))
    buf.close()
    c = buf.next_chunk()
    assert c is not None and (c.number, c.row_start, c.row_end) == (2, 5, 9)
    assert [v for b in c.batches for v in b.column(0).to_pylist()] == [5, 6, 7, 8]
    assert buf.next_chunk() is None


def test_partial_chunk_is_cut_when_older_than_the_interval() -> None:
    buf = ChunkBuffer(batch_size=1000, interval=0.05)
    buf.add(rows(0, 3))
    t0 = time.monotonic()
    c = buf.next_chunk()  # the input is still open
    waited = time.monotonic() - t0
    assert c is not None and c.num_rows == 3
    assert 0.03 <= waited < 2


def test_a_slow_consumer_blocks_the_producer() -> None:
    buf = ChunkBuffer(batch_size=10, interval=60, max_ready=2)
    added = [0]

    def produce() -> None:
        for i in range(20):
            buf.add(rows(i * 10, i * 10 + 10))
            added[0] += 1
        buf.close()

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    deadline = time.monotonic() + 5
    while added[0] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    t.join(0.3)
    assert t.is_alive(), "the producer was not held back"
    assert added[0] <= 3, f"{added[0]} batches buffered with max_ready=2"
    got = 0
    while (c := buf.next_chunk()) is not None:
        got += c.num_rows
    t.join(5)
    assert got == 200 and not t.is_alive()


def test_consumer_failure_reaches_the_producer() -> None:
    buf = ChunkBuffer(batch_size=1, interval=60, max_ready=1)
    buf.add(rows(0, 1))
    buf.fail(RuntimeError("database gone"))
    try:
        buf.add(rows(1, 3))
    except RuntimeError as e:
        assert "database gone" in str(e)
    else:
        raise AssertionError("add() did not raise the flusher's error")

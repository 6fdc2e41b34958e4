"""Benchmark of the disk under a checkpoint: how long the durable writes a micro-batch waits
for take on this machine. Run from the repo root:
``.venv/bin/python bench/fsync_latency.py [--dir FOLDER] [--n 50]``.

A checkpointed batch waits for files written the way ``headrace.checkpoint`` writes them
(a temporary file, ``fsync``, ``rename`` to its name, ``fsync`` of the folder): its offsets
entry, each stateful operator's changelog, then its commit marker. On a fast machine that
chain, not computing, is most of a small batch's time (docs/performance.md,
"transforms_stateful.py"). Printed, median and 90th percentile of ``--n`` writes each, for a
small entry (an offsets entry or a commit marker) and a changelog-sized one:

- ``new file``: the checkpoint's pattern above;
- ``new file, no folder fsync``: the same without the folder's fsync (not durable: the name
  can be lost), to show what the folder's fsync costs;
- ``append + fdatasync``: appending to one open file (the size changes, so the file system
  still commits its journal);
- ``overwrite + fdatasync``: rewriting blocks already written (no metadata to commit), the
  floor of a durable write on this disk;
- ``8 new files at once``: eight of the checkpoint's pattern on eight threads, per file (the
  engine groups the fsyncs of entries planned ahead).

The folder defaults to a fresh one under the system's temporary folder (where the benches'
checkpoints live); ``--dir`` measures another disk. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from headrace.checkpoint import atomic_write


def _write_new(folder: str, name: str, data: bytes, *, folder_fsync: bool = True) -> None:
    """One file written as the checkpoint writes its files (its own ``atomic_write``)."""
    atomic_write(os.path.join(folder, name), data, sync_dir=folder_fsync)


def _timed(n: int, one: Callable[[int], None]) -> list[float]:
    times = []
    for i in range(n):
        t = time.perf_counter()
        one(i)
        times.append(time.perf_counter() - t)
    return times


def _line(label: str, times: list[float]) -> str:
    times = sorted(times)
    p90 = times[min(len(times) - 1, int(len(times) * 0.9))]
    return f"   {label:30s} median {statistics.median(times) * 1000:6.2f} ms   p90 {p90 * 1000:6.2f} ms"


def measure(folder: str, size: int, n: int) -> dict[str, list[float]]:
    """Each write pattern ``n`` times with ``size`` bytes, in a fresh subfolder of ``folder``."""
    sub = tempfile.mkdtemp(prefix=f"fsync-{size}-", dir=folder)
    data = os.urandom(size)
    out: dict[str, list[float]] = {}
    out["new file"] = _timed(n, lambda i: _write_new(sub, f"a{i}", data))
    out["new file, no folder fsync"] = _timed(n, lambda i: _write_new(sub, f"b{i}", data, folder_fsync=False))
    fd = os.open(os.path.join(sub, "append"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:

        def append(_: int) -> None:
            os.write(fd, data)
            os.fdatasync(fd)

        out["append + fdatasync"] = _timed(n, append)
    finally:
        os.close(fd)
    fd = os.open(os.path.join(sub, "overwrite"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, bytes(size * n))  # the blocks, written and durable before the clock
        os.fsync(fd)

        def overwrite(i: int) -> None:
            os.pwrite(fd, data, i * size)
            os.fdatasync(fd)

        out["overwrite + fdatasync"] = _timed(n, overwrite)
    finally:
        os.close(fd)
    with ThreadPoolExecutor(8) as pool:
        per_file: list[float] = []
        for r in range(max(n // 8, 1)):
            t = time.perf_counter()
            list(pool.map(lambda k, r=r: _write_new(sub, f"c{r}-{k}", data), range(8)))
            per_file.append((time.perf_counter() - t) / 8)
        out["8 new files at once"] = per_file
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dir", default=None, help="the folder to measure in (default: the system's temporary folder)"
    )
    ap.add_argument("--n", type=int, default=50, help="writes per pattern (default 50)")
    ap.add_argument(
        "--sizes", default="200,524288", help="bytes per write, comma-separated (default 200,524288)"
    )
    args = ap.parse_args(argv)
    folder = args.dir or tempfile.gettempdir()
    print(f"fsync latency in {folder} (load average {os.getloadavg()[0]:.2f})")
    with tempfile.TemporaryDirectory(dir=folder) as root:
        for size in (int(s) for s in args.sizes.split(",")):
            print(f"{size:,} bytes a write, {args.n} writes a pattern:")
            for label, times in measure(root, size, args.n).items():
                print(_line(label, times))


if __name__ == "__main__":
    main()

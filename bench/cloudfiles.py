"""Benchmark of the cloudFiles source. Run from the repo root: ``.venv/bin/python bench/cloudfiles.py``.

1. Throughput: newline-delimited JSON files -> Arrow rows/s through headrace (cloudFiles ->
   noop sink, trigger available_now) vs plain ``pyarrow.json.read_json`` over the same files in
   the same run. Ratio goal >= 0.8.
2. Trigger cost vs history: the time of one trigger that discovers, reads and commits 10 new
   files when 200,000 files were already ingested vs when none were. Ratio goal <= 2. Measured
   for the default listing (auto: incremental once names are seen to sort lexically) and, for
   reference, for a full listing every trigger (useIncrementalListing=false), which is
   proportional to the folder by nature.

Prints measurements; asserts nothing. ``--files`` / ``--history`` scale it down for a quick run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402
import pyarrow.json as pj  # noqa: E402

import headrace as hr  # noqa: E402
from headrace.plugins import registry  # noqa: E402
from headrace.protocols import ReadLimit, SourceContext  # noqa: E402


def write_json_files(folder: Path, files: int, rows: int) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    total = 0
    for f in range(files):
        lines = [
            json.dumps({"id": f * rows + i, "name": f"user-{i % 977}", "score": (i * 7919) % 1000 / 10.0,
                        "active": i % 3 == 0, "tags": ["a", "b"][: i % 3]})
            for i in range(rows)
        ]  # fmt: skip
        (folder / f"part-{f:05d}.json").write_text("\n".join(lines) + "\n")
        total += rows
    return total


def bench_throughput(work: Path, files: int, rows: int, repeats: int) -> None:
    src = work / "json"
    total = write_json_files(src, files, rows)
    paths = sorted(str(p) for p in src.iterdir())
    size = sum(os.path.getsize(p) for p in paths)

    def plain() -> float:
        t0 = time.perf_counter()
        n = sum(pj.read_json(p).num_rows for p in paths)
        assert n == total
        return time.perf_counter() - t0

    def headrace(k: int, schema: Path) -> float:
        chk = work / f"chk{k}"
        seen = []
        t0 = time.perf_counter()
        q = (
            hr.read_stream.format("cloudFiles")
            .options({"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
                      "cloudFiles.schemaLocation": str(schema), "cloudFiles.maxFilesPerTrigger": 100_000})
            .load(str(src)).write_stream.format("noop").option("checkpointLocation", str(chk))
            .on_progress(lambda p: seen.append(p.to_dict()["numInputRows"]))
            .trigger(available_now=True).start()
        )  # fmt: skip
        q.await_termination()
        dt = time.perf_counter() - t0
        assert sum(seen) == total, (sum(seen), total)
        return dt

    plain()  # warm the page cache
    base = statistics.median(plain() for _ in range(repeats))
    # first start: infers the schema (a 64 KiB prefix of each of up to 1000 sampled files), then ingests
    first = statistics.median(headrace(-1 - k, work / f"schema-first-{k}") for k in range(repeats))
    ours = statistics.median(headrace(k, work / "schema-first-0") for k in range(repeats))  # schema stored
    print(f"[throughput] {files} JSON files, {total:,} rows, {size / 1e6:.1f} MB (median of {repeats})")
    print(f"  plain pyarrow.json.read_json : {total / base:12,.0f} rows/s  ({base:.3f} s)")
    print(f"  headrace cloudFiles -> noop  : {total / ours:12,.0f} rows/s  ({ours:.3f} s, new checkpoint each run: listing,")
    print("                                  file index, offsets/commits, query start; schema already stored)")
    print(f"  ratio headrace/plain         : {base / ours:.2f}   (goal >= 0.8)")
    print(f"  first start (infer the schema from a 64 KiB prefix of up to 1000 files, then ingest): "
          f"{total / first:,.0f} rows/s ({first:.3f} s), ratio {base / first:.2f}   (goal >= 0.8)")  # fmt: skip


def _source(path: Path, state: Path, listing: str) -> object:
    spec = registry().get("cloudFiles")
    raw = {"path": str(path), "cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
           "cloudFiles.schemaHints": "id BIGINT", "cloudFiles.schemaLocation": str(state / "schema"),
           "cloudFiles.useIncrementalListing": listing}  # fmt: skip
    (state / "idx").mkdir(parents=True, exist_ok=True)
    return spec.load_source()(spec.source_options.parse(raw), SourceContext(state_path=str(state / "idx")))


def _trigger(src: object, start: dict) -> tuple[dict, float, int]:
    """One trigger as the engine runs it: latest_offset, partitions, read, commit, metrics."""
    t0 = time.perf_counter()
    end = src.latest_offset(start, ReadLimit(max_files=1000))  # type: ignore[attr-defined]
    rows = 0
    for p in src.partitions(start, end):  # type: ignore[attr-defined]
        rows += sum(b.num_rows for b in src.read(p))  # type: ignore[attr-defined]
    src.commit(end)  # type: ignore[attr-defined]
    src.metrics(end)  # type: ignore[attr-defined]
    return end, time.perf_counter() - t0, rows


def _add(folder: Path, tag: str, n: int = 10) -> None:
    d = folder / tag
    d.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (d / f"f{i:03d}.json").write_text(json.dumps({"id": i}) + "\n")


def _measure(folder: Path, state: Path, listing: str, rounds: int) -> float:
    src = _source(folder, state, listing)
    try:
        start = src.initial_offset()  # type: ignore[attr-defined]
        _ = src.schema  # type: ignore[attr-defined]
        # ingest the history (discovery + admission; reading it is not what is measured here)
        end = src.latest_offset(start, ReadLimit.all_available())  # type: ignore[attr-defined]
        src.commit(end)  # type: ignore[attr-defined]
        times = []
        for r in range(rounds + 1):
            _add(folder, f"zz-new-{listing}-{r:03d}")
            end, dt, rows = _trigger(src, end)
            assert rows == 10, rows
            if r:  # the first round settles the listing mode (auto: sees that names sort lexically)
                times.append(dt)
        return statistics.median(times)
    finally:
        src.close()  # type: ignore[attr-defined]


def bench_history(work: Path, history: int, rounds: int) -> None:
    big, empty = work / "big", work / "empty"
    per_dir = 1000
    t0 = time.perf_counter()
    for d in range(history // per_dir):
        sub = big / f"d{d:04d}"
        sub.mkdir(parents=True)
        for i in range(per_dir):
            (sub / f"f{i:04d}.json").write_bytes(b'{"id": 1}\n')
    empty.mkdir()
    print(f"\n[trigger vs history] {history:,} files already ingested (created in {time.perf_counter() - t0:.1f} s), "
          f"10 new files per trigger, median of {rounds} triggers")  # fmt: skip
    for listing, label in (("auto", "default listing (auto -> incremental)"), ("false", "full listing every trigger")):
        with_history = _measure(big, work / f"state-big-{listing}", listing, rounds)
        without = _measure(empty, work / f"state-empty-{listing}", listing, rounds)
        goal = "   (goal <= 2)" if listing == "auto" else "   (reference: proportional to the folder)"
        print(f"  {label:40s}: {with_history * 1000:8.1f} ms with history, {without * 1000:7.1f} ms without"
              f" -> ratio {with_history / without:.2f}{goal}")  # fmt: skip
        shutil.rmtree(empty)
        empty.mkdir()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=200, help="JSON files in the throughput test")
    ap.add_argument("--rows", type=int, default=5000, help="rows per JSON file")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--history", type=int, default=200_000, help="files already ingested in the trigger test")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headrace-bench-cloudfiles-"))
    try:
        print(f"pyarrow {pa.__version__}, {os.cpu_count()} CPUs, work folder {work}")
        bench_throughput(work, args.files, args.rows, args.repeats)
        bench_history(work, args.history, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

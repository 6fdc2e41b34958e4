"""Collapsing duplicate keys within a chunk, sorted by key (no server)."""

from __future__ import annotations

import pyarrow as pa

from headrace_lakebase.dedupe import last_per_key_sorted


def test_last_row_per_key_wins_and_rows_are_sorted() -> None:
    t = pa.table({"a": [3, 1, 3, 2, 1], "b": ["x", "y", "x", "z", "y"], "v": [1, 2, 3, 4, 5]})
    out = last_per_key_sorted(t, ["a", "b"])
    assert out.to_pylist() == [{"a": 1, "b": "y", "v": 5}, {"a": 2, "b": "z", "v": 4}, {"a": 3, "b": "x", "v": 3}]


def test_composite_keys_differing_in_one_part_are_kept() -> None:
    t = pa.table({"a": [1, 1, 1], "b": ["q", "p", "q"], "v": [1, 2, 3]})
    assert last_per_key_sorted(t, ["a", "b"]).to_pylist() == [{"a": 1, "b": "p", "v": 2}, {"a": 1, "b": "q", "v": 3}]


def test_unique_keys_are_only_sorted() -> None:
    t = pa.table({"k": ["b", "a", "c"], "v": [1, 2, 3]})
    assert last_per_key_sorted(t, ["k"])["k"].to_pylist() == ["a", "b", "c"]

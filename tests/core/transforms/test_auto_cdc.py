"""headrace.transforms.auto_cdc: preparing a batch of change events and resolving them by key."""

from __future__ import annotations

import pyarrow as pa
import pytest

from headrace.options import OptionSchema
from headrace.transforms.auto_cdc import (
    AUTO_CDC_OPTIONS,
    AUTO_CDC_RULES,
    DELETE,
    SEQ,
    AutoCdcError,
    AutoCdcSpec,
    last_per_key,
    prepare,
    sort_events,
)

SCHEMA = OptionSchema(AUTO_CDC_OPTIONS, rules=AUTO_CDC_RULES)


def events() -> pa.Table:
    return pa.table({
        "id": [1, 1, 2, 1, 2, 3, 3],
        "v": ["a", "b", "x", "pre", None, "old", "new"],
        "seq": [1, 3, 2, 9, 5, 7, 7],
        "_change_type": ["insert", "update_postimage", "insert", "update_preimage", "delete", "delete", "insert"],
    })  # fmt: skip


def spec(**kw: object) -> AutoCdcSpec:
    base = {"sequenceBy": "seq", "applyAsDeletes": "_change_type = 'delete'", **kw}
    return AutoCdcSpec.from_options(SCHEMA.parse(base, connector="t", role="sink"), ["id"])


@pytest.mark.parametrize("condition", ["_change_type = 'delete'", "_change_type IN ('delete')"], ids=["arrow", "duckdb"])
def test_prepare_drops_preimages_and_flags_deletes(condition: str) -> None:
    t = prepare(events(), spec(applyAsDeletes=condition, exceptColumnList="_change_type"))
    assert t.column_names == ["id", "v", "seq", SEQ, DELETE]
    assert t.num_rows == 6 and "pre" not in t["v"].to_pylist()
    assert t[DELETE].to_pylist() == [False, False, False, True, True, False]


def test_latest_per_key_by_sequence_non_delete_wins_ties() -> None:
    latest = last_per_key(prepare(events(), spec(columnList="v")), ["id"])
    assert [(r["id"], r["v"], r[DELETE]) for r in latest.to_pylist()] == [(1, "b", False), (2, None, True), (3, "new", False)]


def test_history_order() -> None:
    ordered = sort_events(prepare(events(), spec()), ["id"])
    assert [(r["id"], r[SEQ], r[DELETE]) for r in ordered.to_pylist()] == [
        (1, 1, False), (1, 3, False), (2, 2, False), (2, 5, True), (3, 7, True), (3, 7, False)]  # fmt: skip


def test_errors_name_the_columns() -> None:
    with pytest.raises(AutoCdcError, match=r"sequenceBy column 'nope'"):
        prepare(events(), spec(sequenceBy="nope"))
    with pytest.raises(AutoCdcError, match=r"cannot drop the key column"):
        prepare(events(), spec(exceptColumnList="id"))
    with pytest.raises(Exception, match=r"applies only to AUTO CDC"):
        SCHEMA.parse({"columnList": "v"}, connector="t", role="sink")

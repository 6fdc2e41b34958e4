"""Static frames live in the api layer; the operators depend on the small StaticTable protocol
(schema, to_arrow), not on the frame class; the old path re-exports for one release."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import headrace as hr
from headrace.api import static
from headrace.errors import OptionsError
from headrace.transforms.join import StaticTable


def test_the_old_path_re_exports_the_api_static_frame() -> None:
    from headrace.transforms import static as old

    for name in ("DataFrameReader", "StaticFrame", "read", "read_source_once"):
        assert getattr(old, name) is getattr(static, name)
    assert hr.StaticFrame is static.StaticFrame
    assert hr.read is static.read


def test_a_static_frame_is_what_the_operators_need() -> None:
    frame = static.StaticFrame.from_arrow(pa.table({"k": [1, 2]}))
    assert isinstance(frame, StaticTable)
    assert frame.schema.names == ["k"]
    assert frame.to_arrow().num_rows == 2


def _parquet(tmp_path: Any) -> str:
    folder = tmp_path / "dims"
    folder.mkdir()
    pq.write_table(pa.table({"k": [1, 2], "label": ["one", "two"]}), folder / "part-0.parquet")
    pq.write_table(pa.table({"k": [3], "label": ["three"]}), folder / "part-1.parquet")
    return str(folder)


@pytest.mark.parametrize("reader", ["hr.read", "dp.read"])
def test_an_unknown_option_is_an_options_error_before_any_read(reader: str, tmp_path: Any) -> None:
    import headrace.pipelines as dp

    r = hr.read if reader == "hr.read" else dp.read
    with pytest.raises(OptionsError, match=r"rowsPerBatchh.*did you mean 'rowsPerBatch'"):
        r.format("rate-micro-batch").option("rowsPerBatchh", 10).load()
    with pytest.raises(OptionsError, match=r"(?s)source 'parquet'.*multiLine: unknown option.*take no options"):
        r.format("parquet").option("multiLine", True).load(str(tmp_path / "not-there"))  # nothing is read


@pytest.mark.parametrize("reader", ["hr.read", "dp.read"])
def test_spark_file_formats_read_the_files(reader: str, tmp_path: Any) -> None:
    import headrace.pipelines as dp

    r = hr.read if reader == "hr.read" else dp.read
    folder = _parquet(tmp_path)
    frame = r.format("parquet").load(folder)
    assert sorted(frame.to_arrow().column("k").to_pylist()) == [1, 2, 3]
    assert frame.schema.names == ["k", "label"]
    (tmp_path / "d.json").write_text('{"k": 1, "label": "one"}\n{"k": 2, "label": "two"}\n')
    t = r.format("json").schema("k BIGINT, label STRING").load(str(tmp_path / "d.json")).to_arrow()
    assert t.to_pylist() == [{"k": 1, "label": "one"}, {"k": 2, "label": "two"}]


def test_dp_read_of_a_connector_goes_through_the_registry(tmp_path: Any) -> None:
    """dp.read.format("delta") is the delta connector's read (its options checked), not a call of
    deltalake of its own."""
    import headrace.pipelines as dp

    deltalake = pytest.importorskip("deltalake")
    path = str(tmp_path / "t")
    deltalake.write_deltalake(path, pa.table({"k": [1, 2]}))
    frame = dp.read.format("delta").load(path)
    assert isinstance(frame, static.StaticFrame)
    assert frame.to_arrow().column("k").to_pylist() == [1, 2]
    with pytest.raises(OptionsError, match="delta"):
        dp.read.format("delta").option("startingVersionn", 0).load(path)


def test_a_lazy_frame_is_read_once_and_kept() -> None:
    calls = []

    def load() -> pa.Table:
        calls.append(1)
        return pa.table({"k": [1, 2, 3]})

    frame = static.StaticFrame.lazy(load, "counted")
    assert calls == []  # nothing read when defined
    evens = frame.where("k % 2 = 1")
    assert evens.to_arrow().column("k").to_pylist() == [1, 3]
    assert frame.count() == 3 and frame.schema.names == ["k"]
    assert calls == [1]
    assert frame.transform(lambda t: t.slice(1)).to_arrow().num_rows == 2
    assert calls == [1]


def test_where_takes_a_condition_or_a_function_of_the_table() -> None:
    frame = static.StaticFrame.from_arrow(pa.table({"k": [1, 2, 3]}))
    assert frame.where("k > 1").to_arrow().column("k").to_pylist() == [2, 3]
    assert frame.where(lambda t: pa.compute.greater(t["k"], 2)).to_arrow().column("k").to_pylist() == [3]

"""Static frames live in the api layer; the operators depend on the small StaticTable protocol
(schema, to_arrow), not on the frame class; the old path re-exports for one release."""

from __future__ import annotations

import pyarrow as pa

import headrace as hr
from headrace.api import static
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

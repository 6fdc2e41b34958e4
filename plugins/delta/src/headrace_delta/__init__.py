"""headrace-delta: Delta Lake as a streaming source and an exactly-once sink, on delta-rs.

    import headrace as hr
    q = (hr.read_stream.format("delta").option("maxFilesPerTrigger", 100).load("/data/events")
           .write_stream.format("delta").option("checkpointLocation", "/data/out/_checkpoints/q")
           .start("/data/out"))

``merge`` upserts a micro-batch idempotently from ``foreach_batch``. Importing this package
does not import deltalake; the source and sink classes do, when a query uses them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headrace_delta._merge import merge

__all__ = ["merge"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "merge":
        from headrace_delta._merge import merge

        return merge
    raise AttributeError(f"module 'headrace_delta' has no attribute {name!r}")

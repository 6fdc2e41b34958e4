"""What a query reads: each source as the user declared it (``read_stream.format(...).load()``),
before the engine builds it at ``start()``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from headrace.errors import redact_url
from headrace.options import Options

__all__ = ["SourcePlan"]


@dataclass
class SourcePlan:
    """A source as the user declared it: connector, validated options, the class to build.
    Built by the reader api at definition time; the engine builds one source from it per query
    run (``Source(options, SourceContext)``)."""

    connector: str
    options: Options
    source_class: type
    user_schema: pa.Schema | None = None
    path: str | None = None
    #: the options as given (path included), for an engine that parses them itself (Spark)
    raw_options: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def describe(self) -> str:
        """``connector`` or ``connector[path]`` (the path redacted), for logs and progress."""
        return f"{self.connector}" + (f"[{redact_url(self.path)}]" if self.path else "")

    def __repr__(self) -> str:
        return f"SourcePlan({self.describe()}, options={self.options!r})"

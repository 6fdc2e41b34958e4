"""Stream transforms: the steps of a stream's logical plan (``operator``) and SQL expressions
evaluated over Arrow (``expressions``, DuckDB imported only when used)."""

from __future__ import annotations

from headrace.transforms.operator import BatchInfo, Operator, OperatorContext

__all__ = ["BatchInfo", "Operator", "OperatorContext"]

"""headrace-lakebase: a batched, exactly-once PostgreSQL upsert sink with Databricks Lakebase
semantics, for any PostgreSQL (connector ``lakebase``, alias ``postgresql``).

Importing this package does not import psycopg; the sink class lives in
``headrace_lakebase.sink`` and is loaded by headrace when a query uses it.
"""

from __future__ import annotations

from headrace_lakebase._options import SINK_OPTIONS, TableName, parse_dbtable
from headrace_lakebase.hookspecs import LakebaseHookSpecs
from headrace_lakebase.params import ConnectionParams

__version__ = "0.1.0"

__all__ = ["SINK_OPTIONS", "ConnectionParams", "LakebaseHookSpecs", "TableName", "parse_dbtable"]

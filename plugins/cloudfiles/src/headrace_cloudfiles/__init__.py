"""headrace-cloudfiles: Auto Loader-like incremental file ingestion for headrace.

    import headrace as hr
    q = (hr.read_stream.format("cloudFiles")
           .option("cloudFiles.format", "json")
           .option("cloudFiles.schemaLocation", "/data/_schemas")
           .load("/data/landing")
           .write_stream.format("delta").option("checkpointLocation", "/data/_chk")
           .trigger(available_now=True).start("/data/bronze"))

Importing this package imports no client library; the source lives in
:mod:`headrace_cloudfiles.source`.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

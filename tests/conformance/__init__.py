"""Spark conformance: the same query on PySpark Structured Streaming and on headrace, over the
same parquet micro-batches, compared batch by batch (see ``harness``)."""

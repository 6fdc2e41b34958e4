"""A ``SPARK_HOME`` for the test sessions whose Python workers import the installed pyspark.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's path. Python
imports a zip's modules from source and caches no bytecode for them, so each fresh worker (the
streaming source runner of a Python data source, transformWithState's runners) compiles pyspark
again: about 1 CPU second here, against 0.3 s from the installed package's bytecode. On a loaded
2-core machine that second becomes more than the fixed 10 s Spark waits for a worker to connect
back ("Python worker failed to connect back"). The folder made here links ``bin``, ``jars``
and the rest of the pip-installed pyspark but has no ``python/lib`` zips, so the workers import
the same pyspark from site-packages, compiled.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["worker_friendly_spark_home"]


def worker_friendly_spark_home() -> str | None:
    """The folder to use as ``SPARK_HOME`` (made once per process), or None where the user set
    ``SPARK_HOME`` or pyspark is not a pip install with its zips."""
    if os.environ.get("SPARK_HOME"):
        return None
    import pyspark

    real = Path(pyspark.__file__).parent
    if not (real / "python" / "lib" / "pyspark.zip").exists() or not (real / "jars").is_dir():
        return None
    home = Path(tempfile.mkdtemp(prefix="headrace-spark-home-"))
    for entry in real.iterdir():
        if entry.name != "python":
            (home / entry.name).symlink_to(entry)
    return str(home)

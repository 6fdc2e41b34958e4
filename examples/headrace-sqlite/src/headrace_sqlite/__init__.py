"""headrace-sqlite: a headrace connector for SQLite tables.

The connector is found through the ``headrace`` entry point (``headrace_sqlite._plugin``); this
package imports nothing heavy at import time.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"

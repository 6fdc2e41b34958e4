"""The contract kit's pytest plugin, loaded through the ``pytest11`` entry point of the
``headrace`` distribution: it registers the kit's markers, so projects running with
``--strict-markers`` need no configuration of their own.

- ``slow``: long end-to-end tests; every kill-and-restart test of the kit has it
  (``pytest -m "not slow"`` for a quick run).
- ``headrace_kill``: the kit's kill-and-restart tests alone (``pytest -m "not headrace_kill"``
  or ``-m headrace_kill``).

Importing this module is cheap: it imports neither pyarrow nor the kit.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MARKERS", "pytest_configure"]

MARKERS = {
    "slow": "longer end-to-end tests (the headrace contract kit's kill-and-restart tests have it)",
    "headrace_kill": "headrace contract kit: SIGKILL-and-restart tests (subprocesses, a few seconds each)",
}


def pytest_configure(config: Any) -> None:
    """Register the markers (called once per pytest session)."""
    registered = "\n".join(config.getini("markers"))
    for name, doc in MARKERS.items():
        if not any(line.split(":", 1)[0].split("(", 1)[0].strip() == name for line in registered.splitlines()):
            config.addinivalue_line("markers", f"{name}: {doc}")

"""The contract kit's pytest plugin, loaded through the ``pytest11`` entry point of the
``headrace`` distribution: it registers the kit's markers, so projects running with
``--strict-markers`` need no configuration of their own.

- ``slow``: long end-to-end tests; every kill-and-restart test of the kit has it
  (``pytest -m "not slow"`` for a quick run).
- ``headrace_kill``: the kit's kill-and-restart tests alone (``pytest -m "not headrace_kill"``
  or ``-m headrace_kill``).

Options: ``--headrace-seed=N`` fixes the seed of the kit's random kills (else
``HEADRACE_KIT_SEED``, else a new one per session); the seed is printed in pytest's header.
Under pytest-xdist every worker uses the seed the header printed (the controller's).

Importing this module is cheap: it imports neither pyarrow nor the kit.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["MARKERS", "pytest_addoption", "pytest_configure", "pytest_configure_node", "pytest_report_header"]

_WORKER_SEED = "headrace_kit_seed"  # the key of the controller's seed in an xdist worker's input

MARKERS = {
    "slow": "longer end-to-end tests (the headrace contract kit's kill-and-restart tests have it)",
    "headrace_kill": "headrace contract kit: SIGKILL-and-restart tests (subprocesses, a few seconds each)",
}


def pytest_addoption(parser: Any) -> None:
    """Add ``--headrace-seed`` (called once per pytest session, before configure)."""
    parser.getgroup("headrace").addoption(
        "--headrace-seed", type=int, default=None, metavar="N",
        help="seed of the headrace contract kit's random kills (default: HEADRACE_KIT_SEED, else a new one "
             "per session, printed in the header)",
    )  # fmt: skip


def pytest_report_header(config: Any) -> str | None:
    """The kit's random-kill seed, printed once per session in pytest's header."""
    from headrace.testing._kills import SEED_ENV, kit_seed

    seed = kit_seed()
    return f"headrace contract kit: random-kill seed {seed} (reproduce with --headrace-seed={seed} or {SEED_ENV}={seed})"


def pytest_configure(config: Any) -> None:
    """Register the markers and fix the kit's seed from ``--headrace-seed``, or in an xdist
    worker from the controller's (called once per pytest session, in each worker too)."""
    seed = config.getoption("headrace_seed", None)
    worker_input = getattr(config, "workerinput", None)
    if worker_input is not None and _WORKER_SEED in worker_input:
        seed = worker_input[_WORKER_SEED]
    if seed is not None:
        from headrace.testing._kills import set_kit_seed

        set_kit_seed(int(seed))
    registered = "\n".join(config.getini("markers"))
    for name, doc in MARKERS.items():
        if not any(line.split(":", 1)[0].split("(", 1)[0].strip() == name for line in registered.splitlines()):
            config.addinivalue_line("markers", f"{name}: {doc}")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist: hand the controller's seed (the one its header prints) to a worker
    (called on the controller, once per worker it starts)."""
    from headrace.testing._kills import kit_seed

    node.workerinput[_WORKER_SEED] = kit_seed()

"""pytest glue for the launchers: start a service for the session, or skip saying what to install.

Set ``HEADRACE_REQUIRE_SERVICES=1`` to make a missing service an error instead of a skip
(for a CI that must not silently skip connector tests).
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import TypeVar

import pytest

from tests.services._base import Service, ServiceUnavailable

S = TypeVar("S", bound=Service)


def serve(service: S) -> Generator[S, None, None]:
    """Start ``service``, yield it, stop it; ``pytest.skip`` (with the install advice) if unavailable."""
    try:
        service.start()
    except ServiceUnavailable as e:
        if os.environ.get("HEADRACE_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{service.name} unavailable and HEADRACE_REQUIRE_SERVICES=1: {e}", pytrace=False)
        pytest.skip(f"{service.name} unavailable: {e}")
    try:
        yield service
    finally:
        service.stop()

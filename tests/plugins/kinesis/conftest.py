"""Fixtures of the kinesis plugin tests: a fault-injecting kinesalite next to the shared one."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.services.fixtures import serve
from tests.services.kinesis import KINESALITE_DIR, Kinesis

FAULTY_JS = Path(__file__).with_name("faulty_kinesalite.js")


class FaultyKinesis(Kinesis):
    """kinesalite whose clock can be moved forward and which can throttle or partially fail calls.

    ``set(clockOffsetMs=..., throttleGetRecords=n, limitListShards=n, partialPutRecords=n)``.
    """

    name = "kinesalite (fault injection)"

    def __init__(self) -> None:
        super().__init__()
        fd, path = tempfile.mkstemp(prefix="kinesalite-control-", suffix=".json")
        os.close(fd)
        self.control = Path(path)
        self._gen = 0
        self._state: dict[str, Any] = {"clockOffsetMs": 0}
        self.control.write_text(json.dumps(self._state))

    def command(self) -> Sequence[str]:
        return [str(self.node), str(FAULTY_JS), str(self.port), str(KINESALITE_DIR), str(self.control)]

    def set(self, **faults: int) -> None:
        """Arm faults (counters restart) and/or move the clock; takes effect within ~20 ms."""
        import time

        self._gen += 1
        self._state = {"clockOffsetMs": self._state.get("clockOffsetMs", 0), **faults, "gen": self._gen}
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state))
        os.replace(tmp, self.control)
        time.sleep(0.1)  # the server re-reads the file every 20 ms


@pytest.fixture(scope="session")
def faulty_kinesis() -> Iterator[FaultyKinesis]:
    yield from serve(FaultyKinesis())

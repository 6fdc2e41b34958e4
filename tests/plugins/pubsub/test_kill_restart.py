"""SIGKILL a pubsub -> files pipeline (a subprocess) inside the source's own critical windows and
at the engine's before_offsets point, then restart: every message exactly once in the output.

The contract suite (test_contract.py) covers the engine's other crash points and random kills.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from headrace.connectors.files import read_files
from headrace.testing import run_pipeline
from tests.plugins.pubsub.helpers import Topic, drain


def output(path: Path) -> Counter[int]:
    table = read_files(str(path), "arrow")
    return Counter(int(v) for v in table.column("payload").to_pylist()) if table.num_rows else Counter()


CRASHES = [
    "pubsub_after_pull:1",  # messages pulled and leased, nothing staged: Pub/Sub redelivers them
    "pubsub_after_stage:1",  # segment 1 staged, not acked: resumed; redeliveries dropped by id
    "before_offsets:0",  # segment 1 staged and acked, offsets/0 not written: resumed again
    "pubsub_after_stage:2",  # batch 0 committed, segment 2 staged, not acked
]


def test_kills_in_the_staging_windows_then_restart(pubsub_emulator: Any, tmp_path: Path) -> None:
    topic = Topic(pubsub_emulator)
    sub = topic.subscription(ack_deadline=2)  # leased messages of a killed run return after 2 s
    sent = topic.publish_ints(60)
    opts = topic.source_options(sub, maxRecordsPerFetch=20)
    spec = {
        "source": {"format": "pubsub", "options": opts},
        "sink": {"format": "files", "options": {"path": str(tmp_path / "out"), "format": "arrow"}},
        "checkpoint": str(tmp_path / "chk"),
        "trigger": {"available_now": True},
    }
    for crash in CRASHES:
        result = run_pipeline(spec, crash=crash, timeout=60)
        assert result.killed, f"crash point {crash} was not reached:\n{result.stderr[-2000:]}"
    deadline = time.monotonic() + 40
    while True:  # available-now stops when idle; messages held by a killed run come back later
        run_pipeline(spec, timeout=60).check()
        got = output(tmp_path / "out")
        if set(got) == set(sent) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(got) == sent, f"missing: {sorted(set(sent) - set(got))[:10]}"
    assert max(got.values()) == 1, f"duplicated: {[v for v, n in got.items() if n > 1][:10]}"
    assert not list((tmp_path / "chk" / "sources" / "0" / "pubsub" / "segments").iterdir()), "staged rows were kept"
    assert not drain(pubsub_emulator, topic.project, sub, idle=2.2), "messages left unacknowledged"

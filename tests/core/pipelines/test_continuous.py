"""Continuous runs: every flow keeps running; stopped and resumed, each row lands once."""

from __future__ import annotations

import threading

from headrace.pipelines.runner import PipelineRun
from headrace.testing import wait_for
from tests.core.pipelines.conftest import actual, expected


def _start(p):
    lines: list[str] = []
    run = PipelineRun(p.load(), continuous=True, out=lines.append)
    box: list = []
    t = threading.Thread(target=lambda: box.append(run.run()), daemon=True)
    t.start()
    return run, t, box, lines


def _caught_up(p, rows):
    def check():
        try:
            return actual(p) == expected(rows)
        except Exception:  # tables not created yet
            return False

    return check


def test_continuous_run_stopped_and_resumed(make_project) -> None:
    p = make_project()
    rows = p.add_files(2)
    run, t, box, lines = _start(p)
    wait_for(_caught_up(p, rows), timeout=60, what="the first files to reach gold")
    rows += p.add_files(3)  # arrive while the flows run
    wait_for(_caught_up(p, rows), timeout=60, what="new files to reach gold")
    run.stop()
    t.join(60)
    assert not t.is_alive()
    assert box[0].state == "STOPPED"
    assert box[0].flows["bronze"] == box[0].flows["silver"] == "STOPPED"
    assert any(line.startswith("[bronze] batch") for line in lines)

    rows += p.add_files(2)  # arrive while stopped
    run, t, box, lines = _start(p)
    wait_for(_caught_up(p, rows), timeout=60, what="files written while stopped to reach gold")
    run.stop()
    t.join(60)
    assert actual(p) == expected(rows)  # every row exactly once across the restart

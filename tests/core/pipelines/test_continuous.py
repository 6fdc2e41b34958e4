"""Continuous runs: every flow keeps running; stopped and resumed, each row lands once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from headrace.pipelines.runner import PipelineRun
from headrace.testing import wait_for
from tests.core.pipelines.conftest import MakeProject, Project, actual, expected


def _start(p: Project) -> tuple[PipelineRun, threading.Thread, list[Any], list[str]]:
    lines: list[str] = []
    run = PipelineRun(p.load(), continuous=True, out=lines.append)
    box: list = []
    t = threading.Thread(target=lambda: box.append(run.run()), daemon=True)
    t.start()
    return run, t, box, lines


def _caught_up(p: Project, rows: list[dict[str, Any]]) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return actual(p) == expected(rows)
        except Exception:  # tables not created yet
            return False

    return check


def test_continuous_run_stopped_and_resumed(make_project: MakeProject) -> None:
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


def test_real_time_update_flow_into_a_sink(make_project: MakeProject) -> None:
    """seeds/001: dp.create_sink + @dp.update_flow with pipelines.trigger=RealTime, in a
    continuous run, runs with the real-time trigger."""
    import headrace as hr

    p = make_project(name="rtm")
    p.write("transformations/defs.py", """
        import headrace as hr
        import headrace.pipelines as dp

        dp.create_sink("rtm_out", "memory", {})

        @dp.update_flow(name="rtm_flow", target="rtm_out", spark_conf={
            "pipelines.trigger": "RealTime", "pipelines.trigger.interval": "1 second"})
        def my_real_time_flow():
            return hr.read_stream.format("rate").option("rowsPerSecond", 200).load()
        """)
    run, t, box, _lines = _start(p)
    q = wait_for(lambda: run._queries.get("rtm_flow"), timeout=30, what="the real-time flow to start")
    assert q is not None  # wait_for returns a truthy value
    assert q.trigger.kind == "real_time" and q.trigger.interval == 1.0
    wait_for(lambda: hr.memory_table("rtm_flow").num_rows > 50, timeout=30, what="rows in the sink")
    run.stop()
    t.join(60)
    assert box[0].flows["rtm_flow"] == "STOPPED"

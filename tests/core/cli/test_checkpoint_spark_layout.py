"""``headrace checkpoint`` refuses Spark's checkpoint layout by either mark (the ``{"id": ...}``
metadata, the ``v1`` line of an offsets entry) and leaves it untouched. The real Spark
checkpoint is tested in tests/spark/test_engine.py; here, the files as Spark 4.3 writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from headrace.cli import main

SPARK_OFFSETS = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1796164741244,"conf":{}}\n{"files":1}\n'


def _spark_checkpoint(root: Path, metadata: dict[str, Any]) -> Path:
    for folder in ("offsets", "commits", "sources"):
        (root / folder).mkdir(parents=True)
    (root / "metadata").write_text(json.dumps(metadata))
    (root / "offsets" / "0").write_text(SPARK_OFFSETS)
    (root / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    return root


@pytest.mark.parametrize(
    ("metadata", "mark"),
    [({"id": "eeadac57-f4c9-40fd-9984-8ee9fb998ef8"}, 'metadata file holds only {"id": ...}'),
     ({"id": "x", "version": 1, "sources": []}, "starts with Spark's 'v1' line")],
    ids=["spark-metadata", "v1-offsets-line"],
)  # fmt: skip
@pytest.mark.parametrize("action", [["show"], ["reset", "--to-batch", "-1"]], ids=["show", "reset"])
def test_spark_checkpoint_refused(tmp_path: Path, capsys: Any, metadata: dict[str, Any], mark: str,
                                  action: list[str]) -> None:  # fmt: skip
    chk = _spark_checkpoint(tmp_path / "chk", metadata)
    assert main(["checkpoint", action[0], str(chk), *action[1:]]) == 1
    err = capsys.readouterr().err
    assert f"checkpoint {chk} is Apache Spark's, not headrace's" in err and mark in err
    assert "Traceback" not in err
    assert (chk / "offsets" / "0").read_text() == SPARK_OFFSETS

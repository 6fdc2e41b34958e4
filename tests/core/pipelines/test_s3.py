"""A pipeline whose storage root is s3:// (moto server): tables in S3, checkpoints local."""

from __future__ import annotations

import os
import uuid
from typing import Any

from tests.core.pipelines.conftest import MakeProject, expected


def test_s3_storage_root(make_project: MakeProject, s3: Any) -> None:
    bucket = s3.create_bucket(f"pipelines-{uuid.uuid4().hex[:8]}")
    storage = s3.delta_storage_options()
    p = make_project()
    conf = "\n".join(f"  storage.{k}: \"{v}\"" for k, v in storage.items())
    p.write("pipeline.yml", f"name: on_s3\nstorage: s3://{bucket}/root\nconfiguration:\n{conf}\n"
                            "libraries:\n  - glob:\n      include: transformations/**\n")  # fmt: skip
    rows = p.add_files(2)
    r = p.run()
    assert r.state == "COMPLETED", r.errors
    from deltalake import DeltaTable

    def table(name: str) -> list[dict]:
        return DeltaTable(f"s3://{bucket}/root/tables/{name}", storage_options=storage).to_pyarrow_table().to_pylist()

    want = expected(rows)
    assert sorted((x["id"], x["k"], x["amount"]) for x in table("silver")) == want["silver"]
    assert {x["k"]: (x["label"], int(x["n"]), int(x["total"])) for x in table("gold")} == want["gold"]
    local = p.path(".headrace", "on_s3")
    assert os.path.isdir(os.path.join(local, "checkpoints", "silver", "silver"))
    with open(os.path.join(local, "event_log", "events.jsonl")) as f:
        assert storage["AWS_SECRET_ACCESS_KEY"] not in f.read()  # no credentials in the event log
    rows += p.add_files(1)
    p.run(full_refresh=["silver"])
    p.run()
    assert sorted((x["id"], x["k"], x["amount"]) for x in table("silver")) == expected(rows)["silver"]

"""cloudFiles over S3 (moto server): listing with StartAfter, partitions, cleanSource MOVE."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from headrace.plugins import registry
from headrace.protocols import ReadLimit, SourceContext
from tests.plugins.cloudfiles.helpers import output, run


def s3_opts(s3: Any, tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"cloudFiles.format": "json", "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.schemaLocation": str(tmp_path / "schema"), "s3.endpointUrl": s3.endpoint_url,
            "cloudFiles.region": s3.region, "s3.accessKeyId": s3.aws_access_key_id,
            "s3.secretAccessKey": s3.aws_secret_access_key, "s3.addressingStyle": "path", **more}  # fmt: skip


def put(client: Any, bucket: str, key: str, rows: list[dict[str, Any]]) -> None:
    client.put_object(Bucket=bucket, Key=key, Body="".join(json.dumps(r) + "\n" for r in rows).encode())


def keys(client: Any, bucket: str, prefix: str) -> list[str]:
    got = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return sorted(o["Key"] for o in got)


def test_s3_ingest_partitions_and_move(s3: Any, tmp_path: Path) -> None:
    bucket = s3.create_bucket(f"cf-{uuid.uuid4().hex[:10]}")
    client = s3.client()
    put(client, bucket, "landing/region=eu/a.json", [{"id": 1}])
    put(client, bucket, "landing/region=us/b.json", [{"id": 2}, {"id": 3}])
    put(client, bucket, "landing/_SUCCESS", [])
    put(client, bucket, "landingzone/other.json", [{"id": 99}])  # a sibling prefix, not under the path
    more = {"cloudFiles.cleanSource": "MOVE", "cloudFiles.cleanSource.moveDestination": f"s3://{bucket}/archive",
            "cloudFiles.cleanSource.retentionDuration": "0s"}  # fmt: skip
    out, chk = tmp_path / "out", tmp_path / "chk"
    run(f"s3://{bucket}/landing", out, chk, **s3_opts(s3, tmp_path, **more))
    rows = sorted(output(out).select(["id", "region"]).to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": 1, "region": "eu"}, {"id": 2, "region": "us"}, {"id": 3, "region": "us"}]
    assert keys(client, bucket, "archive/") == ["archive/region=eu/a.json", "archive/region=us/b.json"]
    assert keys(client, bucket, "landing/") == ["landing/_SUCCESS"]
    assert keys(client, bucket, "landingzone/") == ["landingzone/other.json"]
    put(client, bucket, "landing/region=eu/c.json", [{"id": 4}])
    q = run(f"s3://{bucket}/landing", out, chk, **s3_opts(s3, tmp_path, **more))
    assert q.recent_progress[0]["numInputRows"] == 1
    assert sorted(output(out).column("id").to_pylist()) == [1, 2, 3, 4]


def test_s3_incremental_listing_starts_after_the_last_key(s3: Any, tmp_path: Path) -> None:
    bucket = s3.create_bucket(f"cf-{uuid.uuid4().hex[:10]}")
    client = s3.client()
    spec = registry().get("cloudFiles")
    raw = {"path": f"s3://{bucket}/p", **s3_opts(s3, tmp_path, **{"cloudFiles.useIncrementalListing": "true"})}
    (tmp_path / "state").mkdir()
    src = spec.load_source()(spec.source_options.parse(raw), SourceContext(state_path=str(tmp_path / "state")))
    try:
        put(client, bucket, "p/2024/01/01.json", [{"id": 1}])
        end = src.latest_offset(src.initial_offset(), ReadLimit.all_available())
        put(client, bucket, "p/2023/12/31.json", [{"id": 0}])  # sorts before: skipped by StartAfter
        put(client, bucket, "p/2024/01/02.json", [{"id": 2}])
        nxt = src.latest_offset(end, ReadLimit.all_available())
        assert [f.rel for f in src.index.files(end["seq"], nxt["seq"])] == ["2024/01/02.json"]
        table = src.read(src.partitions(end, nxt)[0])
        assert [r for b in table for r in b.to_pylist()] == [{"id": 2, "_rescued_data": None}]
    finally:
        src.close()

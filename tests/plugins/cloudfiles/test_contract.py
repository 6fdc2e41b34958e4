"""The headrace source contract, over a local folder and over S3 (moto server)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headrace.protocols import ReadLimit
from headrace.testing import SourceContract
from tests.plugins.cloudfiles.helpers import write_json

ROWS_PER_FILE = 3


class _Seeder:
    def __init__(self, put: Callable[[str, bytes], object]) -> None:  # the result is unused
        self.put = put
        self.n = 0
        self.files = 0

    def __call__(self, n: int) -> None:
        rows = list(range(self.n, self.n + n))
        self.n += n
        for i in range(0, len(rows), ROWS_PER_FILE):
            chunk = rows[i : i + ROWS_PER_FILE]
            data = "".join(json.dumps({"id": v, "name": f"row-{v}"}) + "\n" for v in chunk).encode()
            self.put(f"part-{self.files:06d}.json", data)
            self.files += 1


class TestLocalSourceContract(SourceContract):
    connector = "cloudFiles"
    limit = ReadLimit(max_files=4)  # 30 rows in 10 files -> batches of 4 files

    @pytest.fixture
    def source_options(self, tmp_path: Path) -> dict[str, Any]:
        (tmp_path / "landing").mkdir()
        return {
            "path": str(tmp_path / "landing"),
            "cloudFiles.format": "json",
            "cloudFiles.schemaLocation": str(tmp_path / "schema"),
            "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.maxFilesPerTrigger": "4",
        }

    @pytest.fixture
    def seed(self, source_options: dict[str, Any]) -> Callable[[int], None]:
        folder = Path(source_options["path"])
        return _Seeder(lambda name, data: write_json(folder, name, [json.loads(x) for x in data.decode().splitlines()]))


class TestS3SourceContract(SourceContract):
    connector = "cloudfiles"  # the alias
    limit = ReadLimit(max_files=4)

    @pytest.fixture
    def source_options(self, tmp_path: Path, s3: Any) -> dict[str, Any]:
        bucket = s3.create_bucket(f"contract-{uuid.uuid4().hex[:12]}")
        return {
            "path": f"s3://{bucket}/landing",
            "cloudFiles.format": "json",
            "cloudFiles.schemaLocation": str(tmp_path / "schema"),
            "cloudFiles.inferColumnTypes": "true",
            "cloudFiles.maxFilesPerTrigger": "4",
            "s3.endpointUrl": s3.endpoint_url,
            "cloudFiles.region": s3.region,
            "s3.accessKeyId": s3.aws_access_key_id,
            "s3.secretAccessKey": s3.aws_secret_access_key,
            "s3.addressingStyle": "path",
        }

    @pytest.fixture
    def seed(self, source_options: dict[str, Any], s3: Any) -> Callable[[int], None]:
        bucket = source_options["path"].split("/")[2]
        client = s3.client()
        return _Seeder(lambda name, data: client.put_object(Bucket=bucket, Key=f"landing/{name}", Body=data))

    # 1,010 files of 3 rows: just past one page (1,000 keys) of S3's object listing. Seeding and
    # reading them on the moto server takes minutes, so the test is a slow one here.
    page_rows = 3030

    @pytest.mark.slow
    def test_many_small_ranges_read_what_one_large_range_reads(self, source: Any, seed: Callable[[int], None]) -> None:
        super().test_many_small_ranges_read_what_one_large_range_reads(source, seed)

    # The crash logic does not depend on where files live (the index is in the checkpoint, and
    # the local suite runs every crash point); on S3 two representative kills keep the suite fast.
    @pytest.mark.slow
    @pytest.mark.parametrize("crash", ["mid_write", "random-kills"])
    def test_kill_and_restart_loses_nothing(
        self, crash: str, source_options: dict[str, Any], seed: Callable[[int], None], tmp_path: Path
    ) -> None:
        super().test_kill_and_restart_loses_nothing(crash, source_options, seed, tmp_path)

"""The shared connector helpers: failOnDataLoss policy, admission budget, retry, not-found."""

from __future__ import annotations

import errno
import logging

import pytest

from headrace.errors import DataLossError
from headrace.helpers.admission import AdmissionBudget
from headrace.helpers.dataloss import FAIL_ON_DATA_LOSS, DataLossPolicy
from headrace.helpers.retry import backoff, retry
from headrace.helpers.storage import is_not_found
from headrace.options import OptionSchema
from headrace.protocols import ReadLimit


def test_data_loss_fails_by_default_and_warns_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    schema = OptionSchema([FAIL_ON_DATA_LOSS])
    strict = DataLossPolicy.from_options(schema.parse({}), "acme")
    with pytest.raises(DataLossError, match=r"acme: offsets 0-9 are gone; fix: set failOnDataLoss=false"):
        strict.lost("offsets 0-9 are gone")
    lenient = DataLossPolicy.from_options(schema.parse({"failondataloss": "false"}), "acme")
    with caplog.at_level(logging.WARNING):
        lenient.lost("offsets 0-9 are gone", skip="continuing at 10")
    assert "acme: offsets 0-9 are gone; continuing at 10 (failOnDataLoss=false)" in caplog.text


def test_budget_for_whole_items() -> None:
    b = AdmissionBudget(ReadLimit(max_files=3, max_bytes=100))
    assert b.admit(files=1, bytes=150)  # the first item always fits
    assert not b.admit(files=1, bytes=1)  # bytes over: refused, and so is every later item
    assert not b.admit(files=1, bytes=0)
    b = AdmissionBudget(ReadLimit(max_files=2))
    assert [b.admit(files=1, bytes=10**9) for _ in range(3)] == [True, True, False]
    assert b.exhausted and b.files == 2
    assert all(AdmissionBudget().admit(files=1, bytes=10**12, rows=10**9) for _ in range(5))


def test_budget_for_record_streams() -> None:
    b = AdmissionBudget(ReadLimit(max_rows=10, max_bytes=1000))
    assert b.reserve(7) == 7 and b.reserve(7) == 3 and b.reserve(1) == 0
    b.give_back(2)
    assert b.reserve(5) == 2
    assert b.estimate(100) == 10  # nothing seen yet
    assert b.add_bytes(500, items=5)
    assert b.estimate(100) == 6  # ~100 bytes a record, 500 left
    assert not b.add_bytes(600, items=6)  # soft: spent once reached
    assert b.reserve(1) == 0
    c = AdmissionBudget(ReadLimit(max_rows=10))
    c.close()
    assert c.closed and c.reserve(5) == 0 and not c.admit(files=1)


def test_retry_retries_transient_errors_with_backoff() -> None:
    calls: list[int] = []
    waits: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("reset")
        return "ok"

    assert retry(flaky, is_transient=lambda e: isinstance(e, ConnectionError), attempts=5, sleep=waits.append) == "ok"
    assert len(calls) == 3 and len(waits) == 2
    with pytest.raises(ValueError, match="permanent"):
        retry(lambda: (_ for _ in ()).throw(ValueError("permanent")), is_transient=lambda e: False, sleep=waits.append)
    with pytest.raises(ConnectionError):
        retry(lambda: (_ for _ in ()).throw(ConnectionError("x")), is_transient=lambda e: True, attempts=2, sleep=waits.append)
    assert all(0.025 <= backoff(a, base=0.05, cap=1.0) <= 1.0 for a in range(1, 20))


class _ClientError(Exception):
    def __init__(self, code: str, status: int) -> None:
        super().__init__(f"An error occurred ({code}) when calling the HeadObject operation: it does not exist")
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


@pytest.mark.parametrize(
    ("error", "not_found"),
    [
        (FileNotFoundError(errno.ENOENT, "gone"), True),
        (OSError(errno.ENOENT, "gone"), True),
        (_ClientError("NoSuchKey", 404), True),
        (_ClientError("AccessDenied", 403), False),
        (_ClientError("NoSuchBucket", 404), False),
        (RuntimeError("Generic DeltaTable error: Object at location x not found"), True),
        (PermissionError(errno.EACCES, "denied"), False),
        (ValueError("bad value"), False),
    ],
    ids=["FileNotFoundError", "ENOENT", "s3-NoSuchKey", "s3-AccessDenied", "s3-NoSuchBucket", "delta-rs-text", "permission", "other"],
)
def test_not_found_detection(error: BaseException, not_found: bool) -> None:
    assert is_not_found(error) is not_found


def test_not_found_through_the_cause_chain() -> None:
    try:
        try:
            raise FileNotFoundError(errno.ENOENT, "x")
        except FileNotFoundError as inner:
            raise RuntimeError("read failed") from inner
    except RuntimeError as e:
        assert is_not_found(e)

"""The transform of the from_json kill test, importable in the pipeline subprocess: rate rows
turned into JSON text (every 5th malformed, every 7th with a non-numeric amount), then
FromJson under badRecordsPolicy=deadLetter into $FROM_JSON_DLQ."""

from __future__ import annotations

import json
import os

import pyarrow as pa

from headrace.transforms.from_json import FromJson


def as_text(t: pa.Table) -> pa.Table:
    texts = []
    for v in t.column("value").to_pylist():
        if v % 5 == 2:
            texts.append(f"{{broken {v}")
        elif v % 7 == 4:
            texts.append(json.dumps({"id": v, "amount": "n/a"}))
        else:
            texts.append(json.dumps({"id": v, "amount": v * 1.5}))
    return pa.table({"body": texts})


decode = FromJson("body", "id BIGINT, amount DOUBLE", badRecordsPolicy="deadLetter",
                  badRecordsPath=os.environ.get("FROM_JSON_DLQ", "/nonexistent"))  # fmt: skip


def transform(t: pa.Table) -> pa.Table:
    return decode(as_text(t))


transform.parts = (as_text, decode)  # type: ignore[attr-defined]  # the engine settles decode's bad records

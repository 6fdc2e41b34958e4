"""Reading one file of each format into Arrow, and inferring a schema from a sample of files.

json, csv and parquet use pyarrow's readers (multi-threaded C++); a json or csv file they
refuse (a malformed record, a value of another type) is read again record by record so that
the bad records are rescued instead of failing the file. text and binaryFile have fixed
schemas. avro uses fastavro, imported only when an avro file is read.

One job per module: :mod:`headrace_cloudfiles.parsing` reads files, :mod:`headrace_cloudfiles.inference`
infers a schema from a sample of them; every public name of both is importable from here.
"""

from __future__ import annotations

import logging

from headrace_cloudfiles.inference import infer_data_schema, inference_bytes, merge_fields, read_prefix
from headrace_cloudfiles.parsing import (
    BINARY_FILE_SCHEMA,
    TEXT_SCHEMA,
    CorruptFileError,
    Parsed,
    ReaderConfig,
    fixed_schema,
    parse_file,
)

__all__ = [
    "BINARY_FILE_SCHEMA",
    "CorruptFileError",
    "Parsed",
    "ReaderConfig",
    "TEXT_SCHEMA",
    "fixed_schema",
    "infer_data_schema",
    "inference_bytes",
    "merge_fields",
    "parse_file",
    "read_prefix",
]

log = logging.getLogger(__name__)

"""Declarative, typed connector options: parsing, coercion, validation, documentation.

A connector declares its options once::

    SCHEMA = OptionSchema(
        [
            Option("maxFilesPerTrigger", Integer(min=1), default=1000, doc="Files per batch, at most."),
            Option("startingVersion", OneOf(Integer(min=0), Choice("latest")), doc="..."),
            Option("password", String(), secret=True),
        ],
        rules=[at_most_one_of("startingVersion", "startingTimestamp")],
        passthrough=[PassThrough("kafka.", doc="Passed to the Kafka client")],
    )
    opts = SCHEMA.parse(raw, connector="delta", role="source")   # raises OptionsError
    opts["maxfilespertrigger"]  # -> 1000 (names match case-insensitively)

Names are matched case-insensitively (so a Databricks ``.option(...)`` chain ports as it is),
string values are coerced by type, and every problem is reported at once, each naming the
option, the bad value and what would be accepted, with a did-you-mean for unknown names.
Secret values are wrapped in :class:`Secret` and never appear in reprs, logs or errors.

The parts, one job per module: :mod:`~headrace.options.option_types` (option types and their parsers),
:mod:`~headrace.options.declarations` (``Option``, ``PassThrough``), :mod:`~headrace.options.rules`
(cross-option rules), :mod:`~headrace.options.values` (the validated ``Options``),
:mod:`~headrace.options.schema` (``OptionSchema``: validation, all problems at once, and
documentation) and :mod:`~headrace.options.secrets` (``Secret``: redaction of secret values).
Every public name is importable from ``headrace.options``.
"""

from __future__ import annotations

import logging

from headrace.errors import OptionProblem, OptionsError, register_secret  # noqa: F401  (importable from here, as before the split)
from headrace.options._text import suggest
from headrace.options.declarations import Option, PassThrough
from headrace.options.option_types import (
    INT64_MAX,  # noqa: F401  (importable from here, as before the split)
    INT64_MIN,  # noqa: F401
    MAX_DURATION_SECONDS,  # noqa: F401
    Boolean,
    Choice,
    Duration,
    Float,
    Integer,
    Json,
    OneOf,
    OptionType,
    PyObject,
    Regex,
    Size,
    String,
    StringList,
    Timestamp,
)
from headrace.options.rules import Rule, all_or_none, at_most_one_of, exactly_one_of, requires, rule
from headrace.options.schema import OptionSchema
from headrace.options.secrets import Secret
from headrace.options.values import Options

__all__ = [
    "Boolean",
    "Choice",
    "Duration",
    "Float",
    "Integer",
    "Json",
    "OneOf",
    "Option",
    "OptionSchema",
    "OptionType",
    "Options",
    "PassThrough",
    "PyObject",
    "Regex",
    "Rule",
    "Secret",
    "Size",
    "String",
    "StringList",
    "Timestamp",
    "all_or_none",
    "at_most_one_of",
    "exactly_one_of",
    "requires",
    "rule",
    "suggest",
]

log = logging.getLogger(__name__)

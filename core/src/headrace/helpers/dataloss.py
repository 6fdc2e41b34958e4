"""``failOnDataLoss``: what a source does when data it must read is gone (retention, vacuum,
trimmed or deleted offsets): fail the query (the default, as in Spark) or log a warning and skip.

::

    from headrace.helpers.dataloss import FAIL_ON_DATA_LOSS, DataLossPolicy

    SOURCE_OPTIONS = OptionSchema([..., FAIL_ON_DATA_LOSS])
    self.data_loss = DataLossPolicy.from_options(options, "kafka")
    self.data_loss.lost("topic-0 offsets 0-99 were deleted by retention", skip="continuing at offset 100")
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headrace.errors import DataLossError
from headrace.options import Boolean, Option

__all__ = ["FAIL_ON_DATA_LOSS", "DataLossPolicy"]

log = logging.getLogger(__name__)

FAIL_ON_DATA_LOSS = Option[bool](
    "failOnDataLoss", Boolean(), default=True,
    doc="Fail the query when data it must read is gone (deleted, expired, trimmed); false logs a warning and skips it.",
)  # fmt: skip


@dataclass(frozen=True)
class DataLossPolicy:
    """Raise :class:`DataLossError` (``fail``) or warn and go on. Picklable."""

    fail: bool = True
    connector: str = ""
    fix: str = "set failOnDataLoss=false to skip what is gone and continue, or start from a new checkpoint"

    @classmethod
    def from_options(cls, options: Mapping[str, Any], connector: str, *, fix: str | None = None) -> DataLossPolicy:
        """The policy of validated options that declare :data:`FAIL_ON_DATA_LOSS`."""
        kwargs: dict[str, Any] = {"fail": bool(options[FAIL_ON_DATA_LOSS.name]), "connector": connector}
        if fix is not None:
            kwargs["fix"] = fix
        return cls(**kwargs)

    def lost(self, what: str, *, skip: str = "skipping it", cause: BaseException | None = None) -> None:
        """Report lost data: ``what`` says what is gone (and where), ``skip`` what happens instead
        when the policy is to go on. Raises :class:`DataLossError` naming the fix (from
        ``cause``), or warns."""
        prefix = f"{self.connector}: " if self.connector and not what.startswith(f"{self.connector}:") else ""
        if self.fail:
            raise DataLossError(f"{prefix}{what}; fix: {self.fix}") from cause
        log.warning("%s%s; %s (failOnDataLoss=false)", prefix, what, skip)

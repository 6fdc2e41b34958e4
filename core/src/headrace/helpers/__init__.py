"""Shared helpers for connectors: what every plugin used to write on its own.

- :mod:`headrace.helpers.dataloss`: the ``failOnDataLoss`` option and its raise-or-warn policy.
- :mod:`headrace.helpers.admission`: a file/byte/row admission budget for one batch, from a
  :class:`~headrace.protocols.ReadLimit` (hard file and row caps, a soft byte cap, always at
  least one item so the stream advances).
- :mod:`headrace.helpers.retry`: retry with exponential backoff and full jitter.
- :mod:`headrace.helpers.storage`: "not found" detection for storage errors (local files, S3 /
  botocore, Google Cloud, Azure, delta-rs, HTTP 404).
- :mod:`headrace.helpers.crash`: crash points for the SIGKILL tests (:func:`crash_point`).
- :mod:`headrace.helpers.badrecords`: the shared bad-record policy.
- :mod:`headrace.helpers.auto_cdc`: applying a change stream to a keyed table (AUTO CDC).
- :mod:`headrace.helpers.durable`: atomic files and a connector's own state store.

This package is the plugin SDK: with the contracts (``protocols``, ``options``, ``errors``,
``types``, ``redaction``, ``plugins``) it is all a plugin may import (contrib.md, section 6).

Each is imported lazily by its submodule; importing this package imports none of them.
"""

from __future__ import annotations

__all__: list[str] = []

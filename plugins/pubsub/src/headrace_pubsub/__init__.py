"""headrace-pubsub: Google Pub/Sub as a headrace source and sink.

Use it through headrace (``read_stream.format("pubsub")``, ``write_stream.format("pubsub")``);
importing this package does not import google-cloud-pubsub.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

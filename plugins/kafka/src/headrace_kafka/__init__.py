"""headrace-kafka: the ``kafka`` source and sink for headrace, on confluent-kafka.

Use it through headrace (``read_stream.format("kafka")``, ``write_stream.format("kafka")``);
the classes are imported lazily, so importing this package does not import confluent-kafka.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

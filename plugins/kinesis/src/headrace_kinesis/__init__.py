"""headrace-kinesis: AWS Kinesis Data Streams for headrace.

Use it through headrace (``read_stream.format("kinesis")`` / ``write_stream.format("kinesis")``);
importing this package does not import boto3.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

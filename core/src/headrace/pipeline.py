"""Old home of the TOML flow files of ``headrace run``, kept for one release: they live in
:mod:`headrace.cli.flow_file` (``FlowFile``, ``load_flow_file``)."""

from __future__ import annotations

from headrace.cli.flow_file import FlowFile as Pipeline
from headrace.cli.flow_file import load_flow_file as load_pipeline

__all__ = ["Pipeline", "load_pipeline"]

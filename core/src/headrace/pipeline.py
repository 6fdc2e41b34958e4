"""Declarative pipelines: a TOML file describing source, transform, sink and trigger.

::

    name = "demo"                       # query name
    checkpoint = "out/checkpoint"       # relative paths are relative to this file

    [source]
    format = "cloudFiles"
    path = "data/in"
    options = { "cloudFiles.format" = "json", "cloudFiles.inferColumnTypes" = true }

    [transform]                         # optional
    function = "my_module:enrich"       # pyarrow.Table -> pyarrow.Table

    [sink]
    format = "delta"
    path = "out/table"
    output_mode = "append"
    options = {}

    [trigger]                           # one of: available_now / once = true,
    available_now = true                # processing_time / real_time = "10 seconds"

``headrace validate FILE`` checks every option of source and sink (all problems at once, no
I/O); ``headrace run FILE`` runs it and prints one progress line per batch.
"""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headrace.errors import HeadraceError, OptionProblem, OptionsError

__all__ = ["Pipeline", "load_pipeline"]

_PATH_KEYS = ("path", "location", "dir", "destination")


def _resolve(base: str, value: Any) -> Any:
    if not isinstance(value, str) or "://" in value or os.path.isabs(value):
        return value
    return os.path.normpath(os.path.join(base, value))


def _resolve_options(base: str, options: dict[str, Any]) -> dict[str, Any]:
    return {k: (_resolve(base, v) if k.lower().endswith(_PATH_KEYS) else v) for k, v in options.items()}


@dataclass
class Pipeline:
    """A pipeline read from a TOML file; paths already resolved against the file's folder."""

    file: str
    name: str
    source_format: str
    source_options: dict[str, Any]
    source_path: str | None
    sink_format: str
    sink_options: dict[str, Any]
    sink_path: str | None
    output_mode: str = "append"
    checkpoint: str | None = None
    transform: str | None = None
    trigger: dict[str, Any] = field(default_factory=lambda: {"available_now": True})

    def transform_function(self) -> Callable[..., Any] | None:
        if not self.transform:
            return None
        module, _, attr = self.transform.partition(":")
        base = os.path.dirname(self.file)
        for p in (base, os.getcwd()):
            if p not in sys.path:
                sys.path.insert(0, p)
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise HeadraceError(
                f"{self.file}: transform function {self.transform!r} cannot be loaded ({e}); "
                "write it as 'module:function' with the module importable from the pipeline's folder"
            ) from None
        if not callable(fn):
            raise HeadraceError(f"{self.file}: transform {self.transform!r} is not a function")
        return fn

    def validate(self) -> None:
        """Check every option of source and sink, raising one OptionsError with all problems."""
        from headrace.api import ENGINE_WRITER_OPTIONS
        from headrace.plugins import registry

        problems: list[OptionProblem] = []
        reg = registry()
        src = reg.get(self.source_format)
        raw = dict(self.source_options)
        if self.source_path is not None:
            raw["path"] = self.source_path
        try:
            src.source_options.parse(raw, connector=src.name, role="source")
        except OptionsError as e:
            problems += [OptionProblem(f"source.{p.option}", p.message) for p in e.problems]
        snk = reg.get(self.sink_format)
        raw = {k: v for k, v in self.sink_options.items() if k not in ENGINE_WRITER_OPTIONS}
        if self.sink_path is not None:
            raw["path"] = self.sink_path
        if snk.name == "memory":
            raw["queryName"] = self.name
        try:
            snk.sink_options.parse(raw, connector=snk.name, role="sink")
        except OptionsError as e:
            problems += [OptionProblem(f"sink.{p.option}", p.message) for p in e.problems]
        if problems:
            raise OptionsError(
                os.path.basename(self.file), "pipeline", problems,
                hint=f"Run `headrace describe {src.name}` and `headrace describe {snk.name}` to list their options.",
            )

    def start(self, on_progress: Callable[..., None] | None = None) -> Any:
        """Start the pipeline's query (validating every option first); returns the StreamingQuery."""
        w = self.writer()
        if on_progress is not None:
            w = w.on_progress(on_progress)
        return w.start(self.sink_path)

    def writer(self) -> Any:
        """The ``DataStreamWriter`` for this pipeline, without the sink path (see ``start``)."""
        import headrace as hr

        frame = hr.read_stream.format(self.source_format).options(self.source_options).load(self.source_path)
        fn = self.transform_function()
        if fn is not None:
            frame = frame.map_batches(fn)
        w = frame.write_stream.format(self.sink_format).options(self.sink_options).output_mode(self.output_mode)
        if self.name:
            w = w.query_name(self.name)
        if self.checkpoint:
            w = w.option("checkpointLocation", self.checkpoint)
        return w.trigger(**self.trigger)


def load_pipeline(path: str) -> Pipeline:
    """Read and check the structure of a pipeline TOML file (options are checked by validate)."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise HeadraceError(f"pipeline file {path!r} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise HeadraceError(f"pipeline file {path!r} is not valid TOML: {e}") from None
    base = os.path.dirname(os.path.abspath(path))
    problems = []
    allowed = {"name", "checkpoint", "source", "sink", "transform", "trigger"}
    for k in doc:
        if k not in allowed:
            problems.append(f"unknown key {k!r} (allowed: {', '.join(sorted(allowed))})")
    src, snk = doc.get("source"), doc.get("sink")
    for section, value in (("source", src), ("sink", snk)):
        if not isinstance(value, dict) or not value.get("format"):
            problems.append(f"[{section}] with a 'format' is required")
    trigger = doc.get("trigger", {"available_now": True})
    if not isinstance(trigger, dict) or len(trigger) != 1:
        problems.append("[trigger] needs exactly one of available_now, once, processing_time, real_time")
    if problems:
        raise HeadraceError(f"pipeline file {path}: " + "; ".join(problems))
    assert isinstance(src, dict) and isinstance(snk, dict)
    transform = doc.get("transform", {})
    return Pipeline(
        file=os.path.abspath(path),
        name=str(doc.get("name", "")),
        source_format=str(src["format"]),
        source_options=_resolve_options(base, dict(src.get("options", {}))),
        source_path=_resolve(base, src.get("path")),
        sink_format=str(snk["format"]),
        sink_options=_resolve_options(base, dict(snk.get("options", {}))),
        sink_path=_resolve(base, snk.get("path")),
        output_mode=str(snk.get("output_mode", "append")),
        checkpoint=_resolve(base, doc.get("checkpoint")),
        transform=transform.get("function") if isinstance(transform, dict) else None,
        trigger=trigger,
    )

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
                                        # (Spark's processingTime / availableNow / realTime too);
                                        # no [trigger] at all means available_now = true

``headrace validate FILE`` checks everything ``run`` would check before starting (structure,
every option of source and sink, trigger, output mode, checkpoint, real-time support; all
problems at once, no I/O); ``headrace run FILE`` runs it and prints one progress line per batch.
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
_TOP_KEYS: dict[str, type] = {"name": str, "checkpoint": str, "source": dict, "sink": dict, "transform": dict, "trigger": dict}
_SECTION_KEYS: dict[str, dict[str, type]] = {
    "source": {"format": str, "path": str, "options": dict},
    "sink": {"format": str, "path": str, "output_mode": str, "options": dict},
    "transform": {"function": str},
}
_TOML_TYPES = {str: "a string", dict: "a table", bool: "true or false"}


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
        """Check everything ``start`` checks before any I/O: every option of source and sink,
        the output mode, the checkpoint, and that the pair supports the trigger. Raises one
        OptionsError with all option problems, or a HeadraceError for the rest."""
        self._validate_options()
        self._validate_query()

    def _validate_query(self) -> None:
        from headrace.api import _NO_CHECKPOINT_NEEDED, make_trigger
        from headrace.plugins import registry

        reg = registry()
        src, snk = reg.get(self.source_format), reg.get(self.sink_format)
        trigger = make_trigger(**self.trigger)
        problems: list[str] = []
        has_checkpoint = self.checkpoint or any(k.lower() == "checkpointlocation" for k in self.sink_options)
        if not has_checkpoint and snk.name not in _NO_CHECKPOINT_NEEDED:
            problems.append(f"a checkpoint is required for sink '{snk.name}': add checkpoint = \"some/folder\" at the top")
        if snk.sink is None:
            problems.append(f"connector '{snk.name}' cannot be written to (it is a source only)")
        if src.source is None:
            problems.append(f"connector '{src.name}' cannot be read from (it is a sink only)")
        if problems:
            raise HeadraceError(f"pipeline file {self.file}: " + "; ".join(problems))
        # importing the classes imports their client libraries (no I/O): their declarations decide
        sink_class = snk.load_sink()
        modes = getattr(sink_class, "output_modes", ("append",))
        if self.output_mode not in modes:
            problems.append(f"sink '{snk.name}' does not support output_mode = {self.output_mode!r}; it supports: "
                            + ", ".join(modes))  # fmt: skip
        if trigger.kind == "real_time":
            source_class = src.load_source()
            if not getattr(source_class, "supports_real_time", False):
                problems.append(f"source '{src.name}' does not support the real-time trigger")
            if not getattr(sink_class, "supports_real_time", False):
                problems.append(f"sink '{snk.name}' does not support the real-time trigger")
        if problems:
            raise HeadraceError(f"pipeline file {self.file}: " + "; ".join(problems))

    def _validate_options(self) -> None:
        from headrace.api import ENGINE_WRITER_OPTIONS
        from headrace.api.writer import parse_engine_options
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
        problems += [OptionProblem(f"sink.{p.option}", p.message) for p in parse_engine_options(self.sink_options)[1]]
        engine = {o.lower() for o in ENGINE_WRITER_OPTIONS}
        raw = {k: v for k, v in self.sink_options.items() if k.lower() not in engine}
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


def _read_toml(path: str) -> dict[str, Any]:
    from headrace._textfile import read_definition_file

    text = read_definition_file(path, "pipeline file",
                                folder_hint=f"give the pipeline's TOML file (e.g. {path}/pipeline.toml)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise HeadraceError(f"pipeline file {path!r} is not valid TOML: {e}") from None
    except RecursionError:
        raise HeadraceError(f"pipeline file {path!r} nests arrays or tables too deeply to read; "
                            "a pipeline file has a few levels") from None  # fmt: skip


def _check_section(where: str, value: dict[str, Any], allowed: dict[str, type], problems: list[str]) -> None:
    from headrace.options import suggest

    for k, v in value.items():
        kind = allowed.get(k)
        if kind is None:
            hint = suggest(k, allowed)
            if hint:
                fix = f"did you mean {hint!r}?"
            elif where in ("[source]", "[sink]"):
                fix = f"connector options go in the options table: options = {{ {k} = ... }} under {where}"
            elif where == "top level" and k in ("format", "path", "options", "output_mode"):
                fix = "it belongs in [source] or [sink]"
            else:
                fix = f"allowed: {', '.join(allowed)}"
            problems.append(f"unknown key {k!r} in {where} ({fix})")
        elif not isinstance(v, kind):
            problems.append(f"{k!r} in {where} must be {_TOML_TYPES[kind]}, not {type(v).__name__} {v!r}")


def load_pipeline(path: str) -> Pipeline:
    """Read and check the structure of a pipeline TOML file (options are checked by validate).

    No I/O beyond reading the file; every structural problem is reported at once.
    """
    from headrace.api import make_trigger

    doc = _read_toml(path)
    base = os.path.dirname(os.path.abspath(path))
    problems: list[str] = []
    _check_section("top level", doc, _TOP_KEYS, problems)
    src, snk = doc.get("source"), doc.get("sink")
    for section in ("source", "sink", "transform"):
        value = doc.get(section)
        if isinstance(value, dict):
            _check_section(f"[{section}]", value, _SECTION_KEYS[section], problems)
    for section, value in (("source", src), ("sink", snk)):
        if not isinstance(value, dict) or not value.get("format"):
            problems.append(f"[{section}] with a 'format' is required")
    trigger = doc.get("trigger", {"available_now": True})
    if isinstance(trigger, dict):
        try:
            kind = make_trigger(**trigger)
        except HeadraceError as e:
            problems.append(f"[trigger]: {e}")
        except TypeError:
            problems.append("[trigger] keys must be names such as processing_time")
        else:
            trigger = {kind.kind: next(iter(trigger.values()))}
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

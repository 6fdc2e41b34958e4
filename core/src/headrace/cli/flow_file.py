"""Flow files: one streaming query (source, optional transform, sink, trigger) written as a
TOML file, for ``headrace run FILE`` and ``headrace validate FILE``. (Declarative pipelines,
graphs of datasets in ``pyspark.pipelines``' shape, are :mod:`headrace.pipelines`.)

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
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headrace.errors import HeadraceError, OptionProblem, OptionsError

__all__ = ["FlowFile", "load_flow_file"]

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
class FlowFile:
    """A flow read from a TOML file; paths already resolved against the file's folder."""

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
    #: problems of the file's structure found while loading it (``validate`` reports them
    #: with the rest; ``load_flow_file`` raises when there are any)
    load_problems: list[str] = field(default_factory=list)

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
        """Check everything ``start`` checks before any I/O: the file's structure, every option
        of source and sink, the output mode, the checkpoint, and that the pair supports the
        trigger. Raises once with every problem: an OptionsError when all are option problems,
        else a HeadraceError listing them all. Called once, before ``start``, on the caller's thread."""
        from headrace.errors import PluginError
        from headrace.plugins import registry

        problems: list[str] = list(self.load_problems)
        option_problems: list[OptionProblem] = []
        reg = registry()
        names: list[str] = []
        try:
            src = reg.get(self.source_format)
            names.append(src.name)
        except PluginError as e:
            problems.append(f"[source] format: {e}")
            src = None
        try:
            snk = reg.get(self.sink_format)
            names.append(snk.name)
        except PluginError as e:
            problems.append(f"[sink] format: {e}")
            snk = None
        option_problems = self._option_problems(src, snk)
        if src is not None and snk is not None:
            problems += self._query_problems(src, snk)
        commands = " and ".join(f"`headrace describe {n}`" for n in names)
        hint = f"Run {commands} to list {'their' if len(names) > 1 else 'its'} options." if names else None
        if option_problems and not problems:
            raise OptionsError(os.path.basename(self.file), "pipeline", option_problems, hint=hint)
        problems += [str(p) for p in option_problems]
        if problems:
            n = len(problems)
            lines = [f"pipeline file {self.file} ({n} problem{'s' if n != 1 else ''}):", *(f"  - {p}" for p in problems)]
            raise HeadraceError("\n".join(lines + ([hint] if option_problems and hint else [])))

    def _query_problems(self, src: Any, snk: Any) -> list[str]:
        from headrace.api import _NO_CHECKPOINT_NEEDED, make_trigger

        problems: list[str] = []
        has_checkpoint = self.checkpoint or any(k.lower() == "checkpointlocation" for k in self.sink_options)
        if not has_checkpoint and snk.name not in _NO_CHECKPOINT_NEEDED:
            problems.append(f"a checkpoint is required for sink '{snk.name}': add checkpoint = \"some/folder\" at the top")
        if snk.sink is None:
            problems.append(f"connector '{snk.name}' cannot be written to (it is a source only)")
        if src.source is None:
            problems.append(f"connector '{src.name}' cannot be read from (it is a sink only)")
        if snk.sink is None or src.source is None:
            return problems
        # importing the classes imports their client libraries (no I/O): their declarations decide
        sink_class = snk.load_sink()
        modes = getattr(sink_class, "output_modes", ("append",))
        if self.output_mode not in modes:
            problems.append(f"sink '{snk.name}' does not support output_mode = {self.output_mode!r}; it supports: "
                            + ", ".join(modes))  # fmt: skip
        if make_trigger(**self.trigger).kind == "real_time":
            source_class = src.load_source()
            if not getattr(source_class, "supports_real_time", False):
                problems.append(f"source '{src.name}' does not support the real-time trigger")
            if not getattr(sink_class, "supports_real_time", False):
                problems.append(f"sink '{snk.name}' does not support the real-time trigger")
        return problems

    def _option_problems(self, src: Any, snk: Any) -> list[OptionProblem]:
        from headrace.api import ENGINE_WRITER_OPTIONS
        from headrace.api.writer import parse_engine_options

        problems: list[OptionProblem] = []
        if src is not None:
            raw = dict(self.source_options)
            if self.source_path is not None:
                raw["path"] = self.source_path
            try:
                src.source_options.parse(raw, connector=src.name, role="source")
            except OptionsError as e:
                problems += [OptionProblem(f"source.{p.option}", p.message) for p in e.problems]
        problems += [OptionProblem(f"sink.{p.option}", p.message) for p in parse_engine_options(self.sink_options)[1]]
        if snk is not None:
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
        return problems

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


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key: str) -> str:
    """``key`` as TOML writes it: bare when it can be, else quoted (a dot inside a bare key
    would make a nested table)."""
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def _toml_value(value: Any) -> str:
    """``value`` as a TOML inline value (what was read from the file, written back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return str(value)  # dates and times: TOML's own literal forms


def _flatten(key: str, value: Any) -> dict[str, Any]:
    """A key TOML read as a nested table (``cloudFiles.format = "json"`` unquoted) back to the
    dotted option names the user meant."""
    if not isinstance(value, dict) or not value:
        return {key: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(_flatten(f"{key}.{k}", v))
    return out


def _check_section(where: str, value: dict[str, Any], allowed: dict[str, type], problems: list[str]) -> None:
    from headrace._words import plural
    from headrace.options import suggest

    misplaced: dict[str, Any] = {}
    for k, v in value.items():
        kind = allowed.get(k)
        if kind is None:
            hint = suggest(k, allowed)
            if hint:
                fix = f"did you mean {hint!r}?"
            elif where != "top level" and k in ("name", "checkpoint"):
                fix = "it belongs at the top level, before [source]"
            elif where in ("[source]", "[sink]"):
                misplaced.update(_flatten(k, v))
                continue
            elif where == "top level" and k in ("format", "path", "options", "output_mode"):
                fix = "it belongs in [source] or [sink]"
            else:
                fix = f"allowed: {', '.join(allowed)}"
            problems.append(f"unknown key {k!r} in {where} ({fix})")
        elif not isinstance(v, kind):
            problems.append(f"{k!r} in {where} must be {_TOML_TYPES[kind]}, not {type(v).__name__} {v!r}")
    if misplaced:
        # the whole options table to write, the ones already there first, with TOML's quoting
        given = value.get("options")
        options: dict[str, Any] = given if isinstance(given, dict) else {}
        table = _toml_value({**options, **misplaced})
        keys = ", ".join(repr(k) for k in misplaced)
        problems.append(f"unknown {plural(len(misplaced), 'key')} {keys} in {where}: connector options go in its options table; "
                        f"fix: write them as options = {table} under {where}")  # fmt: skip


def load_flow_file(path: str) -> FlowFile:
    """Read a pipeline TOML file and check its structure; when it has problems, raise once with
    every one of them and every problem ``FlowFile.validate`` finds in what could be read
    (options, trigger, output mode, checkpoint). No I/O beyond reading the file."""
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
            trigger = {"available_now": True}
        except TypeError:
            problems.append("[trigger] keys must be names such as processing_time")
            trigger = {"available_now": True}
        else:
            trigger = {kind.kind: next(iter(trigger.values()))}
    else:
        trigger = {"available_now": True}
    if not (isinstance(src, dict) and isinstance(snk, dict)
            and isinstance(src.get("format"), str) and isinstance(snk.get("format"), str)):  # fmt: skip
        raise HeadraceError(f"pipeline file {path}: " + "; ".join(problems))

    def get(section: Any, key: str, kind: type, default: Any) -> Any:
        value = section.get(key, default) if isinstance(section, dict) else default
        return value if isinstance(value, kind) else default  # a wrong type is in problems already

    p = FlowFile(
        file=os.path.abspath(path),
        name=get(doc, "name", str, ""),
        source_format=src["format"],
        source_options=_resolve_options(base, dict(get(src, "options", dict, {}))),
        source_path=_resolve(base, get(src, "path", str, None)),
        sink_format=snk["format"],
        sink_options=_resolve_options(base, dict(get(snk, "options", dict, {}))),
        sink_path=_resolve(base, get(snk, "path", str, None)),
        output_mode=get(snk, "output_mode", str, "append"),
        checkpoint=_resolve(base, get(doc, "checkpoint", str, None)),
        transform=get(doc.get("transform"), "function", str, None),
        trigger=trigger,
        load_problems=problems,
    )
    if problems:
        p.validate()  # raises with these problems and every other one
    return p

"""``pipeline.yml``: the pipeline spec, shaped like Spark's ``spark-pipeline.yml``::

    name: orders
    storage: storage                 # local folder (relative to this file) or s3://bucket/prefix
    catalog: main                    # optional: names like main.sales.x resolve to x
    database: sales                  # (or schema:)
    configuration:                   # strings; storage.* go to delta-rs (e.g. storage.AWS_REGION)
      pipelines.trigger.interval: "1 second"
    libraries:
      - glob:
          include: transformations/**

Found in the current folder or its parents (``pipeline.yml``, ``pipeline.yaml``,
``spark-pipeline.yml``, ``spark-pipeline.yaml``), or given with ``--spec``. Loading imports
every ``.py`` library with the definitions registering into a fresh registry, and parses every
``.sql`` library.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from headrace.errors import HeadraceError
from headrace.pipelines._context import registering
from headrace.pipelines.elements import GraphRegistry, PipelineDefinitionError
from headrace.pipelines.graph import DataflowGraph
from headrace.pipelines.storage import PipelineStorage

__all__ = ["SPEC_FILE_NAMES", "LoadedPipeline", "PipelineSpec", "find_spec", "load_pipeline", "load_spec"]

SPEC_FILE_NAMES = ("pipeline.yml", "pipeline.yaml", "spark-pipeline.yml", "spark-pipeline.yaml")
_FIELDS = {"name", "storage", "catalog", "database", "schema", "configuration", "libraries"}


class SpecError(HeadraceError):
    """A pipeline spec that is missing, unreadable or malformed."""


@dataclass(frozen=True)
class PipelineSpec:
    """A parsed pipeline spec; ``path`` is the spec file, relative paths are relative to it."""

    path: str
    name: str
    storage: str
    catalog: str | None = None
    database: str | None = None
    configuration: Mapping[str, str] = field(default_factory=dict)
    libraries: Sequence[str] = ("transformations/**",)

    @property
    def base_dir(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))

    def storage_root(self) -> str:
        s = self.storage
        if s.startswith("file://"):
            s = s[len("file://"):]
        if "://" in s or os.path.isabs(s):
            return s
        return os.path.normpath(os.path.join(self.base_dir, s))

    def make_storage(self) -> PipelineStorage:
        root = self.storage_root()
        local = root
        if "://" in root:
            local = self.configuration.get("pipelines.localStorage") or os.path.join(self.base_dir, ".headrace", self.name)
            if not os.path.isabs(local):
                local = os.path.join(self.base_dir, local)
        opts = {k[len("storage."):]: v for k, v in self.configuration.items() if k.startswith("storage.")}
        return PipelineStorage(root, local, opts)


def find_spec(start: str | None = None) -> str:
    """The spec file in ``start`` (default: the current folder) or the nearest parent."""
    cur = os.path.abspath(start or os.getcwd())
    while True:
        found = [os.path.join(cur, n) for n in SPEC_FILE_NAMES if os.path.isfile(os.path.join(cur, n))]
        if len(found) > 1:
            raise SpecError(f"{cur} has several pipeline specs ({', '.join(os.path.basename(f) for f in found)}); keep one")
        if found:
            return found[0]
        parent = os.path.dirname(cur)
        if parent == cur:
            raise SpecError(
                f"no pipeline spec ({' / '.join(SPEC_FILE_NAMES)}) in {os.path.abspath(start or os.getcwd())} or its "
                "parents; create one with `headrace pipelines init NAME`, or pass --spec PATH"
            )
        cur = parent


def _str_dict(value: Any, field_name: str, path: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{path}: {field_name} must be a mapping of strings, not {type(value).__name__}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, dict | list) or v is None:
            raise SpecError(f"{path}: {field_name}.{k} must be a string (quote it in YAML), not {v!r}")
        out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _libraries(value: Any, path: str) -> list[str]:
    if value is None:
        return ["transformations/**"]
    if not isinstance(value, list):
        raise SpecError(f"{path}: libraries must be a list of '- glob: {{include: PATTERN}}' entries")
    out = []
    for entry in value:
        if isinstance(entry, str):
            out.append(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("glob"), dict) and isinstance(entry["glob"].get("include"), str):
            out.append(entry["glob"]["include"])
        elif isinstance(entry, dict) and isinstance(entry.get("file"), dict) and isinstance(entry["file"].get("path"), str):
            out.append(entry["file"]["path"])
        else:
            raise SpecError(f"{path}: library entry {entry!r} must be '- glob: {{include: PATTERN}}'")
    return out


def load_spec(path: str) -> PipelineSpec:
    """Read and check a spec file (every problem at once)."""
    try:
        import yaml
    except ImportError:
        raise HeadraceError("pipeline specs need PyYAML; pip install 'headrace[pipelines]'") from None
    from headrace._textfile import read_definition_file

    text = read_definition_file(path, "pipeline spec", error=SpecError,
                                folder_hint=f"give the spec file (e.g. {os.path.join(path, 'pipeline.yml')})")  # fmt: skip
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"pipeline spec {path!r} is not valid YAML: {e}") from None
    except RecursionError:
        raise SpecError(f"pipeline spec {path!r} nests lists or mappings too deeply to read; "
                        "a spec has a few levels (name, storage, configuration, libraries)") from None  # fmt: skip
    if not isinstance(doc, dict):
        raise SpecError(f"pipeline spec {path!r} must be a YAML mapping with at least 'name'")
    problems = [f"unknown field {k!r} (allowed: {', '.join(sorted(_FIELDS))})" for k in doc if k not in _FIELDS]
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append("'name' (a non-empty string) is required")
    storage = doc.get("storage", "storage")
    if not isinstance(storage, str) or not storage:
        problems.append("'storage' must be a folder or an s3:// URI")
    if problems:
        raise SpecError(f"pipeline spec {path}: " + "; ".join(problems))
    return PipelineSpec(
        path=os.path.abspath(path),
        name=str(name),
        storage=str(storage),
        catalog=doc.get("catalog"),
        database=doc.get("database", doc.get("schema")),
        configuration=_str_dict(doc.get("configuration"), "configuration", path),
        libraries=_libraries(doc.get("libraries"), path),
    )


@contextlib.contextmanager
def in_dir(path: str) -> Iterator[None]:
    """Run with ``path`` as the working folder (relative paths in definitions), as Spark does."""
    prev = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(prev)


def library_files(spec: PipelineSpec) -> list[str]:
    import glob

    files: list[str] = []
    for pattern in spec.libraries:
        full = os.path.join(spec.base_dir, pattern)
        if pattern.endswith("/**"):
            full += "/*"
        matches = sorted(p for p in glob.glob(full, recursive=True) if os.path.isfile(p) and "__pycache__" not in p)
        if not matches:
            raise SpecError(f"{spec.path}: library pattern {pattern!r} matches no file under {spec.base_dir}")
        for p in matches:
            if p.endswith((".py", ".sql")) and p not in files:
                files.append(p)
    return files


def _import_python(path: str, index: int) -> None:
    mod_name = f"_headrace_pipeline_{index}_{os.path.splitext(os.path.basename(path))[0]}"
    mspec = importlib.util.spec_from_file_location(mod_name, path)
    if mspec is None or mspec.loader is None:
        raise SpecError(f"cannot import {path}")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[mod_name] = module
    try:
        mspec.loader.exec_module(module)
    except HeadraceError as e:
        raise PipelineDefinitionError(f"{path}: {e}") from None
    except Exception as e:
        raise PipelineDefinitionError(f"{path}: importing it raised {type(e).__name__}: {e}") from e


@dataclass
class LoadedPipeline:
    """A spec with its definitions loaded into a graph (not analysed yet)."""

    spec: PipelineSpec
    graph: DataflowGraph

    @property
    def storage(self) -> PipelineStorage:
        return self.graph.storage


def load_pipeline(spec_path: str | None = None) -> LoadedPipeline:
    """Find/read the spec and load every library's definitions (no data read)."""
    spec = load_spec(spec_path or find_spec())
    reg = GraphRegistry()
    from headrace.pipelines import _context
    from headrace.pipelines.sql import register_sql_file

    token = _context._config.set(dict(spec.configuration))
    if spec.base_dir not in sys.path:  # definitions may import helper modules next to the spec
        sys.path.insert(0, spec.base_dir)
    try:
        with in_dir(spec.base_dir), registering(reg):
            for i, f in enumerate(library_files(spec)):
                if f.endswith(".py"):
                    _import_python(f, i)
                else:
                    register_sql_file(f, reg, spec.configuration)
    finally:
        _context._config.reset(token)
    graph = DataflowGraph(reg, spec.make_storage(), base_dir=spec.base_dir, catalog=spec.catalog, database=spec.database)
    graph.configuration = dict(spec.configuration)
    return LoadedPipeline(spec, graph)

"""No read path can run code: a walk over the source of headrace and every plugin
(``core/src``, ``plugins/*/src``) fails on any call of a decoder that can execute what it
reads -- ``pickle``/``cloudpickle``/``dill`` ``load(s)`` and ``Unpickler``, ``marshal``
``load(s)``, ``shelve``, ``yaml.load``/``unsafe_load``/``full_load`` (``safe_load`` is fine),
``pandas.read_pickle``, ``numpy.load(..., allow_pickle=True)``, and the ``eval``/``exec``
builtins -- however it was imported (``import pickle as p``, ``from pickle import loads``).

How the walk is scoped, honestly: checkpoints, state, offsets, sink records, pipeline specs and
everything else read back from disk or a server go through this source, so forbidding these
calls in all of it covers every checkpoint and state read path without having to enumerate
them. Two exceptions, both for objects that never come from a file:

- ``core/src/headrace/spark/``: the Spark adapter unpickles what Spark itself pickles and
  ships between its processes in flight (input partitions, commit messages); Spark's own
  protocol, never read back from a checkpoint;
- ``pickle.loads(pickle.dumps(x))`` written as one expression: the contract kit checks that an
  object survives pickling (the bytes are made in the same expression, from memory).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = [ROOT / "core" / "src", *sorted((ROOT / "plugins").glob("*/src"))]
EXEMPT = [ROOT / "core" / "src" / "headrace" / "spark"]

PICKLERS = {"pickle", "cloudpickle", "dill", "_pickle", "cPickle"}
FORBIDDEN = {
    **{f"{m}.{f}": "unpickles" for m in PICKLERS for f in ("load", "loads", "Unpickler")},
    "marshal.load": "unmarshals code objects",
    "marshal.loads": "unmarshals code objects",
    "shelve.open": "unpickles",
    "yaml.load": "can build arbitrary Python objects (use yaml.safe_load)",
    "yaml.unsafe_load": "can build arbitrary Python objects",
    "yaml.full_load": "can build arbitrary Python objects",
    "yaml.load_all": "can build arbitrary Python objects (use yaml.safe_load_all)",
    "yaml.unsafe_load_all": "can build arbitrary Python objects",
    "yaml.full_load_all": "can build arbitrary Python objects",
    "pandas.read_pickle": "unpickles",
    "builtins.eval": "runs code",
    "builtins.exec": "runs code",
}


def _sources() -> list[Path]:
    out = []
    for tree in TREES:
        for p in tree.rglob("*.py"):
            if not any(p.is_relative_to(e) for e in EXEMPT):
                out.append(p)
    return sorted(out)


def _names(tree: ast.Module) -> dict[str, str]:
    """Local name -> what it refers to (``p`` -> ``pickle``, ``loads`` -> ``pickle.loads``)."""
    names = {"eval": "builtins.eval", "exec": "builtins.exec", "np": "numpy", "pd": "pandas"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    base = names.get(node.id)
    if base is None:
        return None
    return ".".join([base, *reversed(parts)])


def _round_trip(call: ast.Call, names: dict[str, str]) -> bool:
    """``pickle.loads(pickle.dumps(...))``: bytes made in the same expression."""
    return (
        len(call.args) == 1
        and isinstance(call.args[0], ast.Call)
        and (_dotted(call.args[0].func, names) or "").rsplit(".", 1)[-1] == "dumps"
    )


def offences(source: str, filename: str = "<src>") -> list[str]:
    """Every reference to a forbidden decoder in ``source`` (called or not: ``loads =
    pickle.loads`` counts), but the round trips described in the module docstring."""
    tree = ast.parse(source, filename)
    names = _names(tree)
    allowed: set[int] = set()
    out = []
    what: str | None  # a name in both loops below; the second one can be None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        what = _dotted(node.func, names) or ""
        if what.endswith(".loads") and what.split(".")[0] in PICKLERS and _round_trip(node, names):
            allowed.add(id(node.func))
        if what == "numpy.load" and any(
            k.arg == "allow_pickle" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
            for k in node.keywords
        ):
            out.append(f"{filename}:{node.lineno}: numpy.load(allow_pickle=...) unpickles")
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Attribute, ast.Name)) or id(node) in allowed:
            continue
        if not isinstance(node.ctx, ast.Load):
            continue
        what = _dotted(node, names)
        why = FORBIDDEN.get(what or "")
        if why is not None:
            out.append(f"{filename}:{node.lineno}: {what} {why}")
    return out


def test_no_source_file_uses_a_decoder_that_can_run_code() -> None:
    files = _sources()
    assert len(files) > 100, f"the walk found only {len(files)} files under {TREES}"
    found = [o for p in files for o in offences(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not found, "decoders that can run code, on a path that may read a checkpoint:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "caught"),
    [
        ("import pickle\npickle.loads(b)", True),
        ("import pickle as p\np.load(f)", True),
        ("from pickle import loads\nloads(b)", True),
        ("from pickle import loads as l\nl(b)", True),
        ("import pickle\npickle.Unpickler(f).load()", True),
        ("import cloudpickle\ncloudpickle.loads(b)", True),
        ("import yaml\nyaml.load(s, Loader=yaml.Loader)", True),
        ("import yaml\nyaml.safe_load(s)", False),
        ("eval(text)", True),
        ("import builtins\nbuiltins.exec(code)", True),
        ("import numpy as np\nnp.load(f, allow_pickle=True)", True),
        ("import numpy as np\nnp.load(f)", False),
        ("import pickle\npickle.loads(pickle.dumps(obj))", False),
        ("import marshal\nmarshal.loads(b)", True),
        ("import json\njson.loads(b)", False),
        ("import pandas as pd\npd.read_pickle(p)", True),
        ("import pickle\nloads = pickle.loads\n[loads(k) for k in keys]", True),
        ("import pickle\nf = map(pickle.loads, rows)", True),
    ],
    ids=lambda v: v if isinstance(v, bool) else v.replace("\n", "; "),
)
def test_the_walk_catches_each_spelling(source: str, caught: bool) -> None:
    assert bool(offences(source)) is caught


def test_the_rocksdb_state_store_no_longer_imports_pickle() -> None:
    """The two modules that unpickled state before (its ``mstate`` entry, keys and rows)."""
    for name in ("rocksdb.py", "rocksdb_codec.py"):
        tree = ast.parse((ROOT / "core" / "src" / "headrace" / "state" / name).read_text())
        assert "pickle" not in _names(tree), f"state/{name} imports pickle"

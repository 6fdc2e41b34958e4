"""``headrace new-plugin``: writes a complete plugin distribution that installs and passes the
contract kit as generated (a SQLite source and/or sink, its options, its contract tests, a
README), so an author starts from green.

The files come from ``template/`` beside this module: ``{{connector}}``, ``{{package}}``,
``{{dist}}`` and ``{{Class}}`` are replaced; ``{{#source}}...{{/source}}``,
``{{#sink}}...{{/sink}}`` and ``{{#both}}...{{/both}}`` keep their text only when the plugin has
a source, a sink, or both.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from headrace.errors import HeadraceError

__all__ = ["new_plugin", "render"]

_NAME = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
_BLOCK = re.compile(r"\{\{#(\w+)\}\}(.*?)\{\{/\1\}\}", re.DOTALL)
_ALONE = re.compile(r"^[ \t]*(\{\{[#/]\w+\}\})[ \t]*\n", re.MULTILINE)


def render(text: str, values: dict[str, str], flags: dict[str, bool]) -> str:
    """Fill one template: conditional blocks first (a marker alone on its line takes the line
    with it), then the ``{{name}}`` values."""
    text = _ALONE.sub(r"\1", text)
    while True:
        new = _BLOCK.sub(lambda m: m.group(2) if flags.get(m.group(1), False) else "", text)
        if new == text:
            break
        text = new
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    left = re.search(r"\{\{[^}]*\}\}", text)
    if left:
        raise AssertionError(f"template placeholder {left.group(0)} left unfilled")
    return text


def new_plugin(name: str, *, source: bool = True, sink: bool = True, directory: str | Path | None = None,
               force: bool = False) -> Path:  # fmt: skip
    """Write the distribution ``headrace-NAME`` into ``directory`` (default ``./headrace-NAME``)
    and return its path. Raises :class:`HeadraceError` for a bad name or a non-empty folder."""
    if not _NAME.fullmatch(name):
        raise HeadraceError(f"plugin name {name!r} is not valid: use lowercase letters, digits and single - or _ "
                            "between them, starting with a letter (e.g. acme, my-db)")  # fmt: skip
    if not source and not sink:
        raise HeadraceError("a plugin needs a source, a sink or both (--source, --sink)")
    slug = name.replace("_", "-")
    values = {
        "connector": name,
        "dist": f"headrace-{slug}",
        "package": "headrace_" + name.replace("-", "_"),
        "Class": "".join(part.capitalize() for part in re.split(r"[-_]", name)),
    }
    flags = {"source": source, "sink": sink, "both": source and sink}
    out = Path(directory) if directory is not None else Path(f"headrace-{slug}")
    if out.exists() and any(out.iterdir()) and not force:
        raise HeadraceError(f"{out} exists and is not empty; fix: choose another --dir, or pass --force to write into it")
    root = resources.files("headrace.scaffold").joinpath("template")
    skip = {"source.py.tmpl": not source, "sink.py.tmpl": not sink}
    for rel, item in _walk(root):
        if skip.get(rel.rsplit("/", 1)[-1], False):
            continue
        target = out / rel.removesuffix(".tmpl").replace("src/pkg", f"src/{values['package']}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render(item.read_text(), values, flags))
    return out


def _walk(root: resources.abc.Traversable, prefix: str = "") -> list[tuple[str, resources.abc.Traversable]]:
    items = []
    for child in sorted(root.iterdir(), key=lambda c: c.name):
        rel = f"{prefix}{child.name}"
        if child.is_dir():
            if child.name != "__pycache__":
                items.extend(_walk(child, rel + "/"))
        elif child.name.endswith(".tmpl"):
            items.append((rel, child))
    return items

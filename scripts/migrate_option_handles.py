"""Move plugins from string option keys to typed handles, mechanically.

    python scripts/migrate_option_handles.py [ROOT]     # then: ruff check --fix plugins; mypy ...

For every plugin under ROOT/plugins: find each read of a declared option by string key in its
modules (``options["x"]``, ``o["x"]``, ``opts["x"]``, ``self.options["x"]`` and the same with
``.is_set("x")`` / ``.reveal("x")``), append a typed handle for it to the plugin's
``_options.py`` (``MAX_FILES_PER_TRIGGER: Option[int] = SOURCE_OPTIONS["maxFilesPerTrigger"]``,
``T | None`` for an option with neither default nor ``required``), and replace the key by the
handle, adding one import line per module. Only those lines change. Idempotent: handles that
exist are reused, so it can be run again after a merge brings new string reads.
"""

from __future__ import annotations

import importlib
import pathlib
import re
import sys

TYPES = {"Integer": "int", "Boolean": "bool", "String": "str", "Duration": "float", "Size": "int", "Float": "float",
         "Timestamp": "datetime.datetime", "StringList": "list[str]", "Choice": "str"}  # fmt: skip
READ = re.compile(r'\b((?:self\.)?(?:options|opts|o))(\[|\.is_set\(|\.reveal\()"([^"]+)"')


def const(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "_", name)
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", s)
    return s.upper().strip("_")


def migrate(plugin: pathlib.Path) -> int:
    src = next((p for p in (plugin / "src").glob("headrace_*") if p.is_dir() and not p.name.endswith(".egg-info")), None)
    if src is None or not (src / "_options.py").exists():
        return 0
    pkg = src.name
    sys.path.insert(0, str(plugin / "src"))
    mod = importlib.import_module(f"{pkg}._options")
    schemas = {n: getattr(mod, n) for n in dir(mod) if n.endswith("_OPTIONS") and hasattr(getattr(mod, n), "options")}
    opt_file = src / "_options.py"
    opt_text = opt_file.read_text()
    existing = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*:\s*Option\[", opt_text, re.M))
    new: dict[str, tuple[str, str, str]] = {}
    replaced = 0
    for f in sorted(src.glob("*.py")):
        if f.name in ("_options.py", "_plugin.py"):
            continue
        text = f.read_text()
        used: set[str] = set()

        def repl(m: re.Match[str], used: set[str] = used) -> str:
            var, how, key = m.groups()
            opt = next((o for s in schemas.values() if (o := s.get(key)) is not None), None)
            if opt is None:
                return m.group(0)
            c = const(opt.name)
            if c not in existing and c not in new:
                t = TYPES.get(type(opt.type).__name__, "Any")
                if opt.default is None and not opt.required and t != "Any":
                    t += " | None"
                sname = next(n for n, s in schemas.items() if s.get(key) is opt)
                new[c] = (opt.name, t, sname)
            used.add(c)
            return f"{var}{how}{c}"

        out, n = READ.subn(repl, text)
        if not n or out == text:
            continue
        replaced += n
        lines = out.splitlines(keepends=True)
        last = max(i for i, line in enumerate(lines[:300]) if line.startswith(("from ", "import ")) and "__future__" not in line)
        while lines[last].rstrip().endswith("(") and not lines[last].startswith(")"):
            last += 1
            while not lines[last].startswith(")"):
                last += 1
        lines.insert(last + 1, f"from {pkg}._options import {', '.join(sorted(used))}\n")
        f.write_text("".join(lines))
    if new:
        block = ["\n# Typed handles: options[HANDLE] is typed (string keys keep working).\n"]
        block += [f'{c}: Option[{t}] = {s}["{name}"]\n' for c, (name, t, s) in sorted(new.items())]
        block.append("__all__ += [" + ", ".join(f'"{c}"' for c in sorted(new)) + "]\n")
        heads: list[str] = []
        if any("datetime." in t for _, t, _ in new.values()) and not re.search(r"^import datetime$", opt_text, re.M):
            heads.append("import datetime\n")
        if any("Any" in t for _, t, _ in new.values()) and not re.search(r"^from typing import .*\bAny\b", opt_text, re.M):
            heads.append("from typing import Any\n")
        if heads:
            opt_text = re.sub(r"^(from __future__ import annotations\n)", lambda m: m.group(1) + "".join(heads), opt_text, count=1, flags=re.M)
        if not re.search(r"^from headrace\.options import[^\n]*\bOption\b|^    Option,$", opt_text, re.M):
            opt_text = opt_text.replace("from headrace.options import ", "from headrace.options import Option, ", 1)
        opt_file.write_text(opt_text.rstrip("\n") + "\n" + "".join(block))
    print(f"{plugin.name}: {replaced} reads, {len(new)} new handles")
    return replaced


def main(argv: list[str]) -> int:
    root = pathlib.Path(argv[0] if argv else ".")
    total = sum(migrate(p) for p in sorted((root / "plugins").iterdir()) if p.is_dir())
    print(f"{total} string-key reads replaced; now run: ruff check --fix plugins && mypy $(ls -d plugins/*/src)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

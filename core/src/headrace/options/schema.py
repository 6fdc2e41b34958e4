"""The declarative option set of one connector role (:class:`OptionSchema`) and its validation.

``OptionSchema.parse`` is called once per ``load()``/``start()`` on the driver, before any I/O:
it coerces every value and reports every problem at once (:class:`~headrace.errors.OptionsError`).
``rows``/``render`` document the options for ``headrace describe``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from headrace.errors import OptionProblem, OptionsError
from headrace.options._text import _short, suggest
from headrace.options.declarations import Option, PassThrough
from headrace.options.rules import Rule
from headrace.options.secrets import Secret
from headrace.options.values import Options

__all__ = ["OptionSchema"]

log = logging.getLogger(__name__)


class OptionSchema:
    """All options of one connector role (source or sink), declared once.

    ``ignore`` names options the engine consumes (``checkpointLocation``) that are accepted
    without being passed on.
    """

    def __init__(
        self,
        options: Iterable[Option] = (),
        *,
        rules: Iterable[Rule] = (),
        passthrough: Iterable[PassThrough] = (),
        ignore: Iterable[str] = (),
    ) -> None:
        self.options = list(options)
        self.rules = list(rules)
        self.passthrough = list(passthrough)
        self.ignore = {i.lower() for i in ignore}
        self._by_lower: dict[str, Option] = {}
        # defaults are written as a user would write them ("10 seconds"); parse them once here
        # so connectors always get typed values, and a bad default fails at declaration
        self._defaults: dict[str, Any] = {}
        for o in self.options:
            if o.default is not None and not o.unsupported:
                try:
                    self._defaults[o.name] = o.type.parse(o.default)
                except ValueError as e:
                    raise ValueError(f"option {o.name!r}: bad default {o.default!r}: {e}") from None
        for o in self.options:
            for n in (o.name, *o.aliases):
                if n.lower() in self._by_lower:
                    raise ValueError(f"option {n!r} is declared twice")
                self._by_lower[n.lower()] = o

    def get(self, name: str) -> Option | None:
        return self._by_lower.get(name.lower())

    def __getitem__(self, name: str) -> Option[Any]:
        """The declaration called ``name`` (or an alias of it), for a typed handle:
        ``MAX_FILES: Option[int] = SOURCE_OPTIONS["maxFilesPerTrigger"]``."""
        opt = self._by_lower.get(name.lower())
        if opt is None:
            raise KeyError(f"{name!r} is not declared; declared: {', '.join(o.name for o in self.options)}")
        return opt

    def extended(self, options: Iterable[Option] = (), *, rules: Iterable[Rule] = ()) -> OptionSchema:
        """A copy with more options and rules (e.g. a connector adding to a shared set)."""
        return OptionSchema(
            [*self.options, *options], rules=[*self.rules, *rules], passthrough=self.passthrough, ignore=self.ignore
        )

    def parse(self, raw: Mapping[str, Any], *, connector: str = "?", role: str = "connector") -> Options:
        """Validate and coerce ``raw``; raise :class:`OptionsError` listing every problem.

        Pure: no I/O. Call it before creating the source or sink.
        """
        problems: list[OptionProblem] = []
        values: dict[str, Any] = {}
        given: list[str] = []
        passthrough: dict[str, dict[str, Any]] = {p.prefix: {} for p in self.passthrough}
        seen: dict[str, str] = {}
        for key, value in raw.items():
            lower = key.lower()
            if lower in self.ignore:
                continue
            opt = self._by_lower.get(lower)
            if opt is None:
                pt = next((p for p in self.passthrough if lower.startswith(p.prefix.lower())), None)
                if pt is not None:
                    canonical = pt.prefix + key[len(pt.prefix):]
                    secret = any(m in lower for m in pt.secret_markers)
                    passthrough[pt.prefix][canonical] = Secret(str(value)) if secret else str(value)
                    continue
                hint = suggest(key, [o.name for o in self.options] + [p.prefix + "*" for p in self.passthrough])
                problems.append(OptionProblem(key, "unknown option" + (f" (did you mean {hint!r}?)" if hint else "")))
                continue
            if opt.name in seen:
                problems.append(OptionProblem(key, f"given twice (also as {seen[opt.name]!r}); give it once"))
                continue
            seen[opt.name] = key
            if opt.unsupported:
                problems.append(OptionProblem(opt.name, f"not supported by headrace: {opt.unsupported}"))
                continue
            if value is None:
                continue
            try:
                parsed = opt.type.parse(value)
            except Exception as e:  # a parser's ValueError, or anything a hostile value provokes
                detail = str(e) if isinstance(e, ValueError) else f"{_short(value)} cannot be parsed ({type(e).__name__})"
                msg = f"invalid value (hidden: secret); expected {opt.type.label}" if opt.secret else detail
                problems.append(OptionProblem(opt.name, msg))
                continue
            values[opt.name] = Secret(parsed) if opt.secret else parsed
            given.append(opt.name)
        for opt in self.options:
            if opt.name in values or opt.unsupported:
                continue
            if opt.required and opt.name not in seen:
                problems.append(OptionProblem(opt.name, "is required" + (f": {opt.doc}" if opt.doc else "")))
                continue
            values[opt.name] = self._defaults.get(opt.name)
        opts = Options(values, given, passthrough, {o.name: o.read_limit for o in self.options if o.read_limit})
        if not problems:
            for r in self.rules:
                try:
                    problems.extend(r.check(opts))
                except Exception as e:  # a rule tripping over a hostile value is still a bad value
                    problems.append(OptionProblem(r.doc, f"the options given cannot be checked ({type(e).__name__}: {str(e)[:200]})"))
        else:
            # still report cross-option problems among options that parsed
            for r in self.rules:
                try:
                    problems.extend(r.check(opts))
                except Exception:
                    continue
        if problems:
            raise OptionsError(connector, role, problems)
        return opts

    def rows(self) -> list[dict[str, str]]:
        """One row per option for documentation: name, type, default, required, doc."""
        rows = []
        for o in self.options:
            default = "" if o.default is None else o.type.render(o.default)
            rows.append(
                {
                    "name": o.name + (f" ({', '.join(o.aliases)})" if o.aliases else ""),
                    "type": o.type.label,
                    "default": "(secret)" if o.secret and default else default,
                    "required": "yes" if o.required else "",
                    "doc": (f"UNSUPPORTED: {o.unsupported}" if o.unsupported else o.doc) + (" (secret)" if o.secret else ""),
                }
            )
        for p in self.passthrough:
            rows.append({"name": p.prefix + "*", "type": "string", "default": "", "required": "", "doc": p.doc})
        return rows

    def render(self, title: str) -> str:
        """A plain-text table of the options and rules (``headrace describe``)."""
        rows = self.rows()
        cols = ["name", "type", "default", "required", "doc"]
        widths = {c: max(len(c), *(len(r[c]) for r in rows)) if rows else len(c) for c in cols[:-1]}
        lines = [title]
        if not rows:
            lines.append("  (no options)")
        else:
            header = "  " + "  ".join(c.ljust(widths[c]) for c in cols[:-1]) + "  doc"
            lines += [header, "  " + "-" * (len(header) + 10)]
            for r in rows:
                lines.append("  " + "  ".join(r[c].ljust(widths[c]) for c in cols[:-1]) + "  " + r["doc"])
        if self.rules:
            lines.append("  rules: " + "; ".join(r.doc for r in self.rules))
        return "\n".join(lines)

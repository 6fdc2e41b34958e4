"""Secret redaction, in one place: what must never reach a message, a log line, a report or a
progress record.

- :func:`redact`: a text with every secret removed (credentials in URLs, ``password=...`` pairs,
  every value registered with :func:`register_secret`, extra values given).
- :func:`register_secret`: remember a value as a secret of this process (called for every
  :class:`headrace.options.Secret`); installs :class:`RedactingLogRecord` so that client
  libraries' own log lines cannot show one either.
- :func:`redact_url`: the password of a URL's ``user:password@`` replaced.
- :func:`redact_record`: a JSON-like value (a progress record, a plugin's metric labels) with
  every value under a credential-looking key (:data:`SECRET_MARKERS`) replaced.
- :func:`scrub_exception`: an exception and its chain with secrets removed.

All are safe to call from any thread. Part of the contracts layer: plugins import it.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "SECRET_MARKERS",
    "RedactingLogRecord",
    "redact",
    "redact_record",
    "redact_url",
    "register_secret",
    "scrub_exception",
]

# option keys and record keys that look like credentials (PassThrough options treat them as secrets)
SECRET_MARKERS: tuple[str, ...] = ("password", "passwd", "secret", "token", "jaas", "ssl.key", "credential",
                                   "private", "account_key", "accountkey", "api_key", "apikey")  # fmt: skip

REDACTED = "***"
_MIN_SECRET_LEN = 4  # shorter values would redact ordinary words; a secret that short is no secret
_MAX_KNOWN = 4096
_known: dict[str, None] = {}  # insertion-ordered set of secret values seen in this process
_known_lock = threading.Lock()
# scheme://user:password@host  (the password may hold anything but '@' and '/', bad escapes too)
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^:/@\s\"']*):([^@/\s\"']*)@")
# password=... / "password": ... in connection strings, DSNs and JSON
_KEY_VALUE = re.compile(
    r"(?i)((?:password|passwd|pwd|secret|token|secretaccesskey|sasl\.password|ssl\.key\.password)"
    r"[\"']?\s*[=:]\s*[\"']?)([^\s\"',;&}]+)"
)


def register_secret(value: object) -> None:
    """Remember ``value`` as a secret of this process, so :func:`redact` removes it from any text.

    Called for every :class:`headrace.options.Secret`. For a URL with credentials, the password
    (as written and percent-decoded) is remembered too, since client libraries quote just that
    part in their errors (``invalid percent-encoded token: "pa%zz"``).
    """
    if not isinstance(value, str | bytes):
        return
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    parts = [text]
    m = _URL_CREDENTIALS.search(text)
    if m:
        pw = m.group(2)
        parts += [pw, urllib.parse.unquote(pw)]
    with _known_lock:
        for part in parts:
            if _looks_secret(part) and part not in _known:
                _known[part] = None
                if len(_known) > _MAX_KNOWN:
                    del _known[next(iter(_known))]
    _install_log_redaction()


class RedactingLogRecord(logging.LogRecord):
    """A log record whose message has every known secret removed (see :func:`redact`).

    Installed as the record factory once a secret is known in the process, so that client
    libraries' own log lines (botocore's DEBUG dump of a signed request, say) cannot show one.
    """

    def getMessage(self) -> str:
        return redact(super().getMessage())


_log_redaction = False


def _install_log_redaction() -> None:
    global _log_redaction
    if _log_redaction:
        return
    _log_redaction = True
    previous = logging.getLogRecordFactory()
    if previous is logging.LogRecord:
        logging.setLogRecordFactory(RedactingLogRecord)
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:  # someone else's factory: wrap it
        record = previous(*args, **kwargs)
        plain = record.getMessage
        record.getMessage = lambda: redact(plain())  # type: ignore[method-assign]
        return record

    logging.setLogRecordFactory(factory)


def _looks_secret(value: str) -> bool:
    """Whether a value is distinctive enough to be removed wherever it appears: 16+ characters,
    or 6+ mixing two kinds (lower, upper, digits, others). A dictionary word ("postgres",
    "testing") is not: removing it everywhere would garble ordinary messages (paths, names),
    and where such a password is quoted (a URL, ``password=...``) the patterns remove it."""
    if len(value) >= 16:
        return True
    if len(value) < 6:
        return False
    kinds = (any(c.islower() for c in value) + any(c.isupper() for c in value) + any(c.isdigit() for c in value)
             + any(not c.isalnum() for c in value))  # fmt: skip
    return kinds >= 2


def redact_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part replaced by ``***``."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}:{REDACTED}@", url)


def redact(text: object, secrets: Iterable[object] = ()) -> str:
    """``str(text)`` with every secret removed: credentials in URLs, ``password=...`` pairs,
    every value registered with :func:`register_secret` and the extra ``secrets`` given.

    Use it on anything that quotes user configuration or a client library's error before it
    reaches a message, a log line or a report.
    """
    out = redact_url(str(text))
    out = _KEY_VALUE.sub(lambda m: m.group(1) + REDACTED, out)
    with _known_lock:
        known = list(_known)
    for s in [*known, *(str(x) for x in secrets if x is not None)]:
        if len(s) >= _MIN_SECRET_LEN and s in out:
            out = out.replace(s, REDACTED)
    return out


def _needs_redaction(text: str) -> bool:
    return redact(text) != text


def scrub_exception(exc: BaseException) -> BaseException:
    """Remove secrets from ``exc`` and its chain (``__cause__`` / ``__context__``) in place.

    String arguments are redacted; an exception whose text still holds a secret after that
    (a custom ``__str__``) is replaced in the chain by a :class:`HeadraceError` carrying the
    redacted text and the original traceback. Returns the exception to raise or log (``exc``
    itself unless it had to be replaced). Used by the engine before an error is stored,
    logged or raised to the user.
    """
    from headrace.errors import HeadraceError  # the hierarchy imports this module

    seen: set[int] = set()

    def scrub(e: BaseException | None) -> BaseException | None:
        if e is None or id(e) in seen:
            return e
        seen.add(id(e))
        try:
            text = str(e)
        except Exception:
            text = ""
        if _needs_redaction(text) or any(isinstance(a, str) and _needs_redaction(a) for a in e.args):
            try:
                e.args = tuple(redact(a) if isinstance(a, str) else a for a in e.args)
            except Exception:
                pass
            try:
                still = _needs_redaction(str(e))
            except Exception:
                still = True
            if still:
                repl = HeadraceError(f"{type(e).__name__}: {redact(text)}").with_traceback(e.__traceback__)
                repl.__cause__ = scrub(e.__cause__)
                repl.__context__ = scrub(e.__context__)
                repl.__suppress_context__ = e.__suppress_context__
                return repl
        e.__cause__ = scrub(e.__cause__)
        e.__context__ = scrub(e.__context__)
        return e

    out = scrub(exc)
    assert out is not None
    return out


_USERINFO = re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]+@")


@functools.lru_cache(maxsize=4096)
def _secret_key(key: str) -> bool:
    lower = key.lower()
    return any(m in lower for m in SECRET_MARKERS)


def redact_record(value: Any) -> Any:
    """A copy of a JSON-like value with every value under a credential-looking key
    (password, secret, token, ...) replaced by ``***``, and the ``user:password@`` of URLs too.
    Applied to every record written (the verdict per key is cached: a query's records repeat
    the same keys every batch)."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if _secret_key(k if type(k) is str else str(k)) and v not in (None, ""):
                out[k] = "***"
            elif type(v) in _PLAIN:
                out[k] = v
            else:
                out[k] = redact_record(v)
        return out
    if isinstance(value, list | tuple):
        return [v if type(v) in _PLAIN else redact_record(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return _USERINFO.sub("***@", value)
    return value


_PLAIN = frozenset({int, float, bool, type(None)})

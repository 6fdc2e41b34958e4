"""Connections of the ``lakebase`` sink: parameters from options or an endpoint plugin,
connecting and re-running work with retries on transient errors."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from headrace.errors import HeadraceError, redact, scrub_exception
from headrace.options import Options
from headrace_lakebase._options import (  # typed option handles
    DATABASE,
    ENDPOINT,
    HOST,
    PASSWORD,
    PORT,
    SSLMODE,
    URL,
    USER,
)
from headrace_lakebase.params import ConnectionParams
from headrace_lakebase.retry import backoff, is_transient

__all__ = ["Connector", "RetriesExhaustedError", "params_from_options"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Conn = psycopg.Connection[tuple[Any, ...]]


class RetriesExhaustedError(HeadraceError):
    """A transient error persisted through every retry."""


def params_from_options(options: Options) -> ConnectionParams:
    """Connection parameters from the sink's options; ``endpoint`` is resolved through the
    ``headrace_lakebase_resolve_endpoint`` hook. Called once per sink instance, on first connect."""
    database = options[DATABASE] if (options.is_set(DATABASE) or not options.is_set(URL)) else None
    if options.is_set(ENDPOINT):
        from headrace.plugins import registry

        endpoint = str(options[ENDPOINT])
        resolved = registry().hook.headrace_lakebase_resolve_endpoint(endpoint=endpoint, options=options.redacted())
        if resolved is None:
            raise HeadraceError(
                f"lakebase: endpoint {endpoint!r} cannot be resolved: no installed plugin implements the "
                "headrace_lakebase_resolve_endpoint hook (Databricks authentication). Fix: install a plugin that "
                "does (e.g. one built on the Databricks SDK), or connect with the url or host/port/user/password options"
            )
        if not isinstance(resolved, ConnectionParams):
            raise HeadraceError(
                f"lakebase: the endpoint plugin returned {type(resolved).__name__} for {endpoint!r}, not "
                "headrace_lakebase.ConnectionParams; fix the plugin"
            )
        overrides: dict[str, Any] = {}
        if resolved.database is None:
            overrides["database"] = database
        for name in ("user", "sslmode", "port"):
            if options.is_set(name) and getattr(resolved, name) is None:
                overrides[name] = options[name]
        if options.is_set(PASSWORD) and resolved.password is None and resolved.password_provider is None:
            overrides["password"] = options.reveal(PASSWORD)
        if overrides:
            from dataclasses import replace

            resolved = replace(resolved, **overrides)
        return resolved
    return ConnectionParams(
        host=options[HOST],
        port=options[PORT],
        user=options[USER],
        database=database,
        sslmode=options[SSLMODE],
        password=options.reveal(PASSWORD) if options.is_set(PASSWORD) else None,
        url=options.reveal(URL) if options.is_set(URL) else None,
    )


class Connector:
    """Opens connections and runs work with retries. One per sink instance (or flusher)."""

    def __init__(self, params_factory: Callable[[], ConnectionParams], *, max_retries: int, connect_timeout: float,
                 what: str) -> None:  # fmt: skip
        self._factory = params_factory
        self._params: ConnectionParams | None = None
        self.max_retries = max_retries
        self.connect_timeout = connect_timeout
        self.what = what
        self.retries = 0

    @property
    def params(self) -> ConnectionParams:
        if self._params is None:
            self._params = self._factory()
        return self._params

    def connect(self) -> Conn:
        """A new connection (autocommit off is not used: work runs in explicit transactions)."""
        p = self.params
        kwargs = p.connect_kwargs()
        kwargs.setdefault("connect_timeout", max(1, round(self.connect_timeout)))
        kwargs.setdefault("application_name", "headrace-lakebase")
        try:
            if p.url:
                return psycopg.connect(p.url, autocommit=True, **kwargs)
            return psycopg.connect(autocommit=True, **kwargs)
        except psycopg.Error as e:  # libpq may quote the URL or its password (a bad percent-escape)
            clean = scrub_exception(e)
            if clean is e:
                raise
            raise clean from None

    def run(self, conn: Conn | None, work: Callable[[Conn], T], *, on_reconnect: Callable[[Conn], None] | None = None,
            stop: Callable[[], bool] | None = None) -> tuple[Conn, T]:  # fmt: skip
        """Run ``work(conn)``, reconnecting and retrying on transient errors (exponential backoff
        with jitter, at most ``max_retries`` retries). ``on_reconnect`` prepares a new connection
        (temporary tables). Returns the connection used and the result. Non-transient errors and
        exhausted retries raise; the message never holds a secret."""
        attempt = 0
        while True:
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = self.connect()
                    if on_reconnect is not None:
                        on_reconnect(conn)
                return conn, work(conn)
            except Exception as e:
                if not is_transient(e):
                    raise
                attempt += 1
                self.retries += 1
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
                conn = None
                if attempt > self.max_retries or (stop is not None and stop()):
                    raise RetriesExhaustedError(
                        f"lakebase: {self.what} failed after {attempt - 1} retries on {self.params.describe()}: "
                        f"{type(e).__name__}: {_clean(e)}; the database stayed unavailable. Fix: check that it is "
                        "up and reachable, or raise maxRetries; restarting the query resumes where it stopped"
                    ) from e
                delay = backoff(attempt)
                log.warning("lakebase: %s: transient error (%s: %s); retry %d/%d in %.2fs",
                            self.what, type(e).__name__, _clean(e), attempt, self.max_retries, delay)  # fmt: skip
                time.sleep(delay)


def _clean(e: BaseException) -> str:
    """The first line of an error, without anything that looks like a password."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return redact(text)

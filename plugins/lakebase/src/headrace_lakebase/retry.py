"""Which PostgreSQL errors are transient; the backoff between retries is the core's
(:func:`headrace.helpers.retry.backoff`)."""

from __future__ import annotations

import psycopg

from headrace.helpers.retry import backoff

__all__ = ["TRANSIENT_SQLSTATES", "backoff", "is_transient"]

TRANSIENT_SQLSTATES = frozenset(
    {
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "53300",  # too_many_connections
        "53400",  # configuration_limit_exceeded
        "57P01",  # admin_shutdown
        "57P02",  # crash_shutdown
        "57P03",  # cannot_connect_now (starting up, recovering)
        "55P03",  # lock_not_available
        "08000", "08001", "08003", "08004", "08006", "08007", "08P01",  # connection exceptions
    }
)  # fmt: skip
"""SQLSTATEs retried with backoff (the class 08 connection errors, deadlocks, throttling)."""


_PERMANENT_CONNECT_ERRORS = (
    "authentication failed",
    "no pg_hba.conf entry",
    "does not exist",
    "invalid connection option",
    "invalid sslmode",
    "permission denied",
    "could not translate host name",
    "invalid integer value",  # a port that is not a number
    "invalid port",
    "missing \"=\" after",  # a malformed connection string
    "invalid uri",
)


def is_transient(error: BaseException) -> bool:
    """True for errors worth retrying on a fresh connection: lost connections, server
    shutdown/restart, deadlock, serialization failure, too many connections."""
    if isinstance(error, psycopg.Error):
        state = getattr(error, "sqlstate", None)
        if state is not None:
            return state in TRANSIENT_SQLSTATES or state.startswith("08")
        # no SQLSTATE: raised by the client (connection refused, closed, reset, timeout), or a
        # connection rejected by the server, which is permanent for bad credentials or names
        text = str(error).lower()
        if any(p in text for p in _PERMANENT_CONNECT_ERRORS):
            return False
        return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
    return isinstance(error, ConnectionError | TimeoutError)

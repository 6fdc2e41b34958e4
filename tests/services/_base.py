"""The one base class every test-service launcher shares.

A launcher subclasses :class:`Service` and says *what* to run (``command``), *when it is
ready* (``is_ready``) and, optionally, how to prepare its temp dir (``prepare``); this module
does the rest for all of them: free port, temp dir, log file, readiness polling without fixed
sleeps, stop by PID (signal, then SIGKILL after a timeout, then the whole process group), and
an error carrying the log's tail when start-up fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

REPO_ROOT = Path(__file__).resolve().parents[2]


class ServiceUnavailable(RuntimeError):
    """The service cannot be had on this machine; the message says what to install."""


class ServiceStartError(RuntimeError):
    """The service was found but did not become ready; the message holds the log's tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that the kernel just reported free on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tcp_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_get(url: str, timeout: float = 0.5) -> tuple[int, bytes] | None:
    """``(status, body)`` of a GET, any HTTP status included; ``None`` when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as e:
        return int(e.code), bytes(e.read() or b"")
    except (OSError, ValueError):
        return None


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    *,
    what: str = "condition",
    interval: float = 0.02,
    max_interval: float = 0.2,
    abort: Callable[[], str | None] | None = None,
) -> None:
    """Poll ``condition`` with a gently growing interval until it is true.

    ``abort`` is checked on every round and, if it returns a message, polling stops with
    :class:`ServiceStartError` (used to notice a server process that already exited).
    """
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        if abort is not None and (reason := abort()) is not None:
            raise ServiceStartError(reason)
        if time.monotonic() >= deadline:
            raise ServiceStartError(f"timed out after {timeout:.1f}s waiting for {what}")
        time.sleep(interval)
        interval = min(interval * 1.5, max_interval)


def stop_process(proc: subprocess.Popen[Any], *, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    """Stop ``proc`` by PID: ``sig``, SIGKILL after ``timeout``, then its process group.

    Every launcher starts its server in a new session, so the process group id is the PID and
    killing the group also ends any helper children (JVM threads, postgres backends, ...).
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when our process dies (PR_SET_PDEATHSIG).

    So a server does not outlive a test run that was itself killed (no teardown ran).
    ``None`` where prctl is not available.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return preexec


def log_tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.exists():
        return "(no log)"
    text = path.read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:]) or "(log is empty)"


class Service(ABC):
    """A server process on 127.0.0.1, started on a free port and stopped by PID.

    Subclasses set ``name`` and implement :meth:`command` and :meth:`is_ready`; they may
    override :meth:`check_available` (raise :class:`ServiceUnavailable` with install advice),
    :meth:`prepare` (one-time set-up in ``self.tmpdir`` before the first launch),
    :meth:`environment`, :meth:`popen_kwargs` and ``stop_signal``.

    Use as a context manager (``with PubSubEmulator() as ps: ...``) or call :meth:`start` /
    :meth:`stop`. :meth:`restart` stops and relaunches on the same port and temp dir.
    ``stop(cleanup=False)`` stops only the process (an outage); a later :meth:`start` brings it
    back on the same port with the same data. Tests sharing a session fixture should use that
    (or :meth:`restart`), never a plain ``stop()``.
    """

    name: str = "service"
    bind_host: str = "127.0.0.1"
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 10.0
    #: SIGKILL the server when the process that started it dies (Linux). Note: the kernel ties
    #: this to the *thread* that started it, so start services from a long-lived thread.
    die_with_parent: bool = True

    def __init__(self, *, port: int | None = None, startup_timeout: float = 60.0) -> None:
        self._requested_port = port
        self.port: int = port or 0
        self.startup_timeout = startup_timeout
        self.tmpdir: Path | None = None
        self.log_path: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float | None = None

    # --- what subclasses provide -------------------------------------------------------
    @abstractmethod
    def command(self) -> Sequence[str]:
        """The server's command line (after ``prepare``)."""

    @abstractmethod
    def is_ready(self) -> bool:
        """True once the server answers; polled until ``startup_timeout``."""

    def check_available(self) -> None:
        """Raise :class:`ServiceUnavailable` when the binaries are missing."""

    def prepare(self) -> None:
        """One-time set-up inside ``self.tmpdir`` before the first launch."""

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def popen_kwargs(self) -> dict[str, Any]:
        return {}

    # --- lifecycle --------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> Self:
        if self.running:
            return self
        if self.tmpdir is not None:  # stopped with cleanup=False: come back on the same port
            self._launch()
            return self
        self.check_available()
        t0 = time.monotonic()
        self.tmpdir = Path(tempfile.mkdtemp(prefix=f"headrace-{self.name}-"))
        self.log_path = self.tmpdir / f"{self.name}.log"
        # A kernel-chosen free port can be taken by someone else before the server binds it:
        # then try again with a fresh one (only when the caller did not ask for a port).
        attempts = 1 if self._requested_port else 3
        try:
            for attempt in range(1, attempts + 1):
                if not self._requested_port:
                    self.port = free_port(self.bind_host)
                try:
                    if attempt == 1:
                        self.prepare()
                    self._launch()
                    break
                except ServiceStartError:
                    if attempt == attempts:
                        raise
        except BaseException:
            self._cleanup()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _launch(self) -> None:
        assert self.log_path is not None
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                list(self.command()),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self.tmpdir,
                start_new_session=True,
                preexec_fn=_die_with_parent() if self.die_with_parent else None,
                **self.popen_kwargs(),
            )
        proc = self.proc

        def exited() -> str | None:
            rc = proc.poll()
            return None if rc is None else f"process exited with code {rc}"

        try:
            wait_until(self.is_ready, self.startup_timeout, what=f"{self.name} to be ready", abort=exited)
        except ServiceStartError as e:
            self._terminate()
            raise ServiceStartError(
                f"{self.name} did not start on {self.bind_host}:{self.port}: {e}\n"
                f"command: {' '.join(self.command())}\n"
                f"--- last lines of {self.log_path} ---\n{log_tail(self.log_path)}"
            ) from None

    def _terminate(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, sig=self.stop_signal, timeout=self.stop_timeout)
            self.proc = None

    def restart(self) -> Self:
        """Stop the server process and launch it again on the same port and data."""
        if self.tmpdir is None:
            return self.start()
        self._terminate()
        self._launch()
        return self

    def stop(self, cleanup: bool = True) -> None:
        """Stop the process (if running) and, unless ``cleanup=False``, remove the temp dir.

        Safe to call twice. After ``stop(cleanup=False)``, :meth:`start` relaunches the server on
        the same port with the same data.
        """
        try:
            self._terminate()
        finally:
            if cleanup:
                self._cleanup()

    def _cleanup(self) -> None:
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<{type(self).__name__} {self.bind_host}:{self.port} {state}>"

"""Running the ``headrace`` command in a subprocess: the one way the tests do it.

- ``cli_command(*args)``: the argv, ``python -m headrace.cli ARGS`` with the running interpreter
  (``script=True``: the installed ``headrace`` console script, as a user types it);
- ``cli_env(*pythonpath, crash=None, **variables)``: this process's environment with folders put
  first on ``PYTHONPATH`` (transform modules, plugins not packaged), ``HEADRACE_TEST_CRASH`` set
  to ``crash`` or removed, and extra variables;
- ``run_cli(*args, ...)``: run it to the end, text output captured, with a timeout;
- ``start_cli(*args, ...)``: start it (a text-mode ``Popen``) for tests that signal, kill or read
  it while it runs;
- ``cli_shell(*args, pipe=...)``: a shell command line piping its output (``| head -1``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Any

__all__ = ["cli_command", "cli_env", "cli_shell", "run_cli", "start_cli"]

Arg = str | os.PathLike[str]


def cli_command(*args: Arg, script: bool = False) -> list[str]:
    """The argv of ``headrace ARGS``."""
    prefix = [os.path.join(os.path.dirname(sys.executable), "headrace")] if script else [sys.executable, "-m", "headrace.cli"]
    return [*prefix, *map(str, args)]


def cli_env(*pythonpath: Arg, crash: str | None = None, **variables: str) -> dict[str, str]:
    """This process's environment for a CLI subprocess (see the module docstring)."""
    env = dict(os.environ)
    if pythonpath:
        rest = [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
        env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), *rest])
    env.pop("HEADRACE_TEST_CRASH", None)
    if crash:
        env["HEADRACE_TEST_CRASH"] = crash
    env.update(variables)
    return env


def run_cli(
    *args: Arg, cwd: Arg | None = None, env: dict[str, str] | None = None, timeout: float = 120, script: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run ``headrace ARGS`` to the end; stdout and stderr captured as text. Never raises for
    the exit code: assert on ``returncode`` (and show ``stderr``)."""
    return subprocess.run(cli_command(*args, script=script), capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout, check=False)  # fmt: skip


def start_cli(
    *args: Arg, cwd: Arg | None = None, env: dict[str, str] | None = None, script: bool = False, **popen: Any
) -> subprocess.Popen[Any]:
    """Start ``headrace ARGS``; ``popen`` goes to ``subprocess.Popen`` (text mode unless ``text=False``)."""
    popen.setdefault("text", True)
    return subprocess.Popen(cli_command(*args, script=script), cwd=cwd, env=env, **popen)


def cli_shell(*args: Arg, pipe: str) -> str:
    """A shell command line running ``headrace ARGS | pipe``."""
    return f"{shlex.join(cli_command(*args))} | {pipe}"

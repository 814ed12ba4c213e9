"""Python processes for tests that run the command (`python -m wfsub ARGS`) or a module, started warm.

A fresh interpreter pays for wfsub's imports (about half a second of CPU, seconds on a loaded machine) before it
does anything, and the suite runs hundreds of commands. Here a fork server (multiprocessing's forkserver, one per
test process) imports the libraries once, and each run is a fork of it: a process of its own, with its own argv,
working directory, environment, `__main__`, standard streams (files, read back when it exits) and exit status.
What it shares with the server is what the server imported before forking: the libraries of PRELOAD, never the
command's own modules (wfsub.cli reads its terminal as it is imported) nor a test's. A test whose subject is the
interpreter's start (what `import wfsub` loads, the console script) starts a fresh one.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).parents[1]

# Imported once by the fork server, so that no run pays for them (what the command and the docs' fences use).
PRELOAD = [
    "tests._warm_child", "tests.examples._fence_runner",
    "wfsub", "wfsub._runtime", "wfsub._runtime._substrate", "wfsub._runtime._client", "wfsub._compiler",
    "wfsub._diagram", "wfsub.stores", "wfsub._store._sqlite", "wfsub._store._postgres", "wfsub.testing",
    "wfsub.lowlevel", "wfsub.contrib.web", "anyio", "pydantic", "click", "rich.console", "rich.table", "asyncpg",
    "structlog", "httpx", "fastapi",
]

_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(PRELOAD)


def context() -> multiprocessing.context.ForkServerContext:
    """The fork server's context, for a test that runs its own function in a warm process."""
    return _SERVER  # type: ignore[return-value]


def command(*args: str, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
            input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m wfsub ARGS`, as an operator runs it: its exit status and what it wrote (as text)."""
    return module("wfsub", *args, cwd=cwd, env=env, input=input, timeout=timeout)


async def acommand(*args: str, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
                   input: str | None = None, timeout: float = 120  # noqa: ASYNC109 (the process's bound)
                   ) -> subprocess.CompletedProcess[str]:
    """`command` without blocking the event loop (a Substrate in the test may be serving it meanwhile)."""
    import anyio

    return await anyio.to_thread.run_sync(
        lambda: command(*args, cwd=cwd, env=env, input=input, timeout=timeout), abandon_on_cancel=True)


def module(name: str, *args: str, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
           input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m NAME ARGS` in `cwd` (the test process's own by default) with `env` (the whole environment, as
    subprocess takes it; by default the test process's) and `input` on its standard input."""
    from tests import _warm_child

    where = str(Path(cwd or os.getcwd()).resolve())
    argv = [sys.executable, "-m", name, *args]
    with tempfile.TemporaryDirectory(prefix="wfsub-warm-") as scratch:
        streams = [os.path.join(scratch, stream) for stream in ("stdin", "stdout", "stderr")]
        Path(streams[0]).write_text(input or "", encoding="utf-8")
        process = _SERVER.Process(target=_warm_child.run_module,
                                  args=(name, list(args), where, dict(os.environ if env is None else env), streams))
        process.start()
        try:
            process.join(timeout)
            if process.is_alive():
                process.kill()
                process.join()
                raise subprocess.TimeoutExpired(argv, timeout, _read(streams[1]), _read(streams[2]))
            code = process.exitcode
        finally:
            process.close()
        assert code is not None
        return subprocess.CompletedProcess(argv, code, _read(streams[1]), _read(streams[2]))


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace")

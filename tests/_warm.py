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

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


class Popen:
    """`subprocess.Popen` for `[sys.executable, "-m", MODULE, ...]` or `[sys.executable, SCRIPT.py, ...]`, started
    warm; any other argv (or `shell=`-like use) is refused, so a test that needs a fresh interpreter says so by
    using subprocess. `stdin`, `stdout` and `stderr` take PIPE, DEVNULL, an open file, or None (the test's own
    stream); pipes are text when `text=True`. Killing it, waiting for it and its exit status (negative for a
    signal) are Popen's."""

    def __init__(self, argv: list[str], *, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
                 stdin: Any = None, stdout: Any = None, stderr: Any = None, text: bool = False) -> None:
        from tests import _warm_child

        self.args = argv
        target = _target(argv)
        where = str(Path(cwd or os.getcwd()).resolve())
        ours: list[int] = []  # pipe ends this process keeps
        theirs: list[int] = []  # the child's ends, closed here once it has them
        ends: list[Any] = []
        for n, spec in enumerate((stdin, stdout, stderr)):
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                mine, child = (w, r) if n == 0 else (r, w)
                ours.append(mine)
                theirs.append(child)
                ends.append(child)
            elif spec == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                theirs.append(fd)
                ends.append(fd)
            elif spec is None:
                ends.append(n)  # (this process's own stream, as it is now: pytest's capture of the test)
            else:
                ends.append(spec.fileno())
        self._process = _SERVER.Process(
            target=_warm_child.run_with_fds,
            args=(target, argv[3:] if target[0] == "module" else argv[2:], where,
                  dict(os.environ if env is None else env), [_Fd(fd) for fd in ends]),
        )
        try:
            self._process.start()
        finally:
            for fd in theirs:
                os.close(fd)
        self.pid = self._process.pid
        self.returncode: int | None = None
        mode = {"encoding": "utf-8"} if text else {}
        files = iter(ours)
        self.stdin = open(next(files), "w" if text else "wb", **mode) if stdin == subprocess.PIPE else None  # noqa: SIM115
        self.stdout = open(next(files), "r" if text else "rb", **mode) if stdout == subprocess.PIPE else None  # noqa: SIM115
        self.stderr = open(next(files), "r" if text else "rb", **mode) if stderr == subprocess.PIPE else None  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None and not self._process.is_alive():
            self._process.join()
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._process.join(timeout)
            if self._process.exitcode is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = self._process.exitcode
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)  # type: ignore[arg-type]

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, input: str | bytes | None = None, timeout: float | None = None) -> tuple[Any, Any]:
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        out = err = None
        if self.stdout is not None:
            out = self.stdout.read()
            self.stdout.close()
        if self.stderr is not None:
            err = self.stderr.read()
            self.stderr.close()
        self.wait(timeout)
        return out, err

    def __del__(self) -> None:
        # (a test that kills its process and never reads what was left is not asked to close the pipes)
        for stream in (self.__dict__.get("stdin"), self.__dict__.get("stdout"), self.__dict__.get("stderr")):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def __enter__(self) -> Popen:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self.wait()
        self._process.close()


async def run_process(argv: list[str], *, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
                      check: bool = False) -> subprocess.CompletedProcess[bytes]:
    """`anyio.run_process` for a warm argv (as `Popen` takes): it runs to its end, its output as bytes."""
    import anyio

    def run() -> subprocess.CompletedProcess[bytes]:
        with Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE) as proc:
            out, err = _drain(proc)
        assert proc.returncode is not None
        if check and proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, argv, out, err)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)


def _drain(proc: Popen) -> tuple[bytes, bytes]:
    """Both pipes read to their ends at once (one alone could fill while the other is read)."""
    got: dict[str, bytes] = {}

    def read(name: str, stream: Any) -> None:
        got[name] = stream.read()

    reader = threading.Thread(target=read, args=("err", proc.stderr))
    reader.start()
    read("out", proc.stdout)
    reader.join()
    return got["out"], got["err"]


def _target(argv: list[str]) -> tuple[str, str]:
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        return ("module", argv[2])
    if len(argv) >= 2 and argv[0] == sys.executable and argv[1].endswith(".py"):
        return ("path", argv[1])
    raise ValueError(f"not a warm argv (python -m MODULE ... or python SCRIPT.py ...): {argv!r}")


class _Fd:
    """A file descriptor handed to the warm child (duplicated into it as the server forks it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        from tests import _warm_child

        return (_warm_child.inherited, (reduction.DupFd(self.fd),))


def run(argv: list[str], *, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(argv, capture_output=True, text=True)` for a warm argv (as `Popen` takes)."""
    with Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
               stderr=subprocess.PIPE) as proc:
        timer = threading.Timer(timeout, proc.kill)  # (a bound on a hang, as subprocess.run's timeout)
        timer.start()
        try:
            out, err = _drain(proc)
        finally:
            timer.cancel()
    assert proc.returncode is not None
    return subprocess.CompletedProcess(argv, proc.returncode, out.decode("utf-8", "replace"),
                                       err.decode("utf-8", "replace"))

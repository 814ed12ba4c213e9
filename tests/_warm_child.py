"""What a warm process runs (see `tests._warm`): kept apart from it so that the fork server imports nothing of
pytest or of the tests."""

from __future__ import annotations

import atexit
import os
import runpy
import sys
import traceback
from typing import Any


def run_module(name: str, args: list[str], cwd: str, env: dict[str, str], streams: list[str]) -> None:
    """`python -m NAME ARGS` in `cwd` with `env`, its standard streams the files `streams` (stdin, stdout,
    stderr); ends the process with the status the module exits with (1 and a traceback for an exception)."""
    fds = []
    for path, fd in zip(streams, (0, 1, 2), strict=True):
        fds.append(os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    run_with_fds(("module", name), args, cwd, env, fds)


def inherited(fd: Any) -> int:
    """A file descriptor handed over by the test process (`tests._warm._Fd`)."""
    return int(fd.detach())


def run_with_fds(target: tuple[str, str], args: list[str], cwd: str, env: dict[str, str], fds: list[int]) -> None:
    """`python -m MODULE ARGS` (target ("module", MODULE)) or `python SCRIPT ARGS` (("path", SCRIPT)) in `cwd`
    with `env`, `fds` its standard streams; ends the process with the status it exits with (1 and a traceback
    for an exception, as the interpreter does)."""
    assert "wfsub.cli._render" not in sys.modules, "the fork server imported the command's consoles (tests._warm)"
    for fd, std in zip(fds, (0, 1, 2), strict=True):
        if fd != std:
            os.dup2(fd, std)
            os.close(fd)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (multiprocessing gave it /dev/null)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    kind, name = target
    sys.path.insert(0, cwd if kind == "module" else os.path.dirname(os.path.abspath(name)))  # as the interpreter
    sys.argv = [name, *args]
    code = 0
    try:
        if kind == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(name, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 (as the interpreter does: the traceback on stderr, status 1)
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)

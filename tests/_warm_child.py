"""What a warm process runs (see `tests._warm`): kept apart from it so that the fork server imports nothing of
pytest or of the tests."""

from __future__ import annotations

import atexit
import os
import runpy
import sys
import traceback


def run_module(name: str, args: list[str], cwd: str, env: dict[str, str], streams: list[str]) -> None:
    """`python -m NAME ARGS` in `cwd` with `env`, its standard streams the files `streams` (stdin, stdout,
    stderr); ends the process with the status the module exits with (1 and a traceback for an exception)."""
    assert "wfsub.cli._render" not in sys.modules, "the fork server imported the command's consoles (tests._warm)"
    for path, fd, flags in ((streams[0], 0, os.O_RDONLY), (streams[1], 1, os.O_WRONLY | os.O_TRUNC),
                            (streams[2], 2, os.O_WRONLY | os.O_TRUNC)):
        file = os.open(path, flags | (os.O_CREAT if fd else 0), 0o600)
        os.dup2(file, fd)
        os.close(file)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (multiprocessing gave it /dev/null)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, cwd)  # as `python -m` puts the working directory first
    sys.argv = [name, *args]
    code = 0
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
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

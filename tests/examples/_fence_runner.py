"""Runs one documentation fence in a process of its own, forked from a server that has wfsub already imported.

A fresh interpreter per fence would pay wfsub's import (about half a second of CPU) forty times over; a fork of a
server that imported it once pays a few milliseconds, and each fence still gets a process of its own: its own
`__main__`, working directory, event loop, logging and files. Kept apart from the test module so that the server
and its children import nothing of pytest.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import sys
import types

# Imported once by the fork server, so that no fence pays for them: what the fences import.
PRELOAD = [
    "wfsub", "wfsub._runtime", "wfsub._compiler", "wfsub._diagram", "wfsub.stores", "wfsub.testing", "wfsub.lowlevel",
    "wfsub.contrib.web", "anyio", "pydantic", "httpx", "fastapi",
]


def run(parts: list[tuple[str, str]], cwd: str, stdout: str, stderr: str) -> None:
    """Run the fences `parts` ((name, code), the last one the fence under test) one after the other in one
    `__main__`, in `cwd`, writing what they print to the files `stdout` and `stderr`. A fence with `await` at its
    top level runs as the asyncio REPL (`python -m asyncio`) runs it. An exception ends the process with status 1
    (multiprocessing prints its traceback to stderr)."""
    for path, fd in ((stdout, 1), (stderr, 2)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file, fd)
        os.close(file)
    os.chdir(cwd)
    sys.path.insert(0, cwd)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main  # classes and functions a fence defines belong to a module that exists
    for name, code in parts:
        compiled = compile(code, f"<fence {name}>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(compiled, main.__dict__)  # the docs' own code: what is tested
        if compiled.co_flags & inspect.CO_COROUTINE:
            asyncio.run(result)

"""Helpers of the process tests: a uvicorn server in its own process group, and HTTP calls that are retried the
way a client retries (a refused or cut connection, a worker that died under the request)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
BOUND = 90.0  # seconds a wait may take before the test fails as hung (a bound against hangs, not an expected time)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """`uvicorn APP --workers N` on a free port, with `env` added to its environment."""

    def __init__(self, app: str, workers: int, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app, "--workers", str(workers), "--port", str(self.port),
             "--log-level", "warning"],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, stdout=self._log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.log = log

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def call(method: str, url: str, *, ok: tuple[int, ...] = (200, 201), **kwargs: Any) -> httpx.Response:
    """A call retried until it gets one of the `ok` statuses: a refused or cut connection, a 5xx and a 202 (the
    result endpoint's "not ended yet") are retried, within BOUND (the call may have been applied before the cut:
    every call the tests retry is idempotent)."""
    deadline = time.monotonic() + BOUND
    last: object = None
    while time.monotonic() < deadline:
        try:
            answer = httpx.request(method, url, timeout=30.0, **kwargs)
        except httpx.TransportError as exc:
            last = exc
        else:
            if answer.status_code in ok:
                return answer
            if answer.status_code < 500 and answer.status_code != 202:
                raise AssertionError(f"{method} {url}: {answer.status_code} {answer.text}")
            last = f"{answer.status_code} {answer.text}"
        time.sleep(0.05)
    raise AssertionError(f"{method} {url} did not succeed within {BOUND:g}s; last: {last}")

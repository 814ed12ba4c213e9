"""An update retried with its request id after a SIGKILL of the process that owned the case gets its answer: killed
inside the reply function (the update journaled, its answer never computed: the replay computes it) and right
after the answer came back (the answer on the case row, or computed again); the update applies once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from wfsub import Substrate

from ._updates_child import WORKFLOWS
from ._util import ROOT, kinds


@pytest.mark.parametrize("when", ["in-reply", "after-answer"])
async def test_update_retried_after_sigkill_gets_its_answer(tmp_path: Path, when: str) -> None:
    """After the owner is SIGKILLed (inside the reply, or after answering), a new owner answers the retried update
    with the same answer, and the journal holds the update once."""
    path = str(tmp_path / "cases.db")
    argv = [sys.executable, "-m", "tests.durable._updates_child", path, when]
    done = await anyio.to_thread.run_sync(lambda: subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                                                                 timeout=60, check=False))
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    if when == "after-answer":
        assert json.loads(done.stdout.strip().splitlines()[-1]) == {"n": 42}
    else:
        assert done.stdout.strip() == ""
    async with Substrate(store=path, workflows=WORKFLOWS) as sub:
        assert await sub.update("u1", "add", 41, request_id="k1") == {"n": 42}
        assert sub.data("u1")["n"] == 42
        assert kinds(await sub.journal("u1")) == ["start", "signal"]
        await sub.signal("u1", "done")
        assert (await sub.await_case("u1"))["n"] == 42

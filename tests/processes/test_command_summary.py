"""The program summary's check through the `wfsub` command with no owner running: a typo, a payload that does
not fit, an unknown region are refused with the owner's message (exit status 1) and nothing reaches the inbox;
a good input is queued; a cancel of an ended case is refused."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path

import anyio
import pytest

from wfsub import Substrate

from .. import _warm
from ._app import loan
from ._http import ROOT


def wfsub(*args: str) -> subprocess.CompletedProcess[str]:
    return _warm.command(*args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)


def inbox(path: Path) -> list[tuple[str, str]]:
    with closing(sqlite3.connect(path)) as conn:
        return [(kind, body) for kind, body in conn.execute("SELECT kind, body FROM inbox ORDER BY id")]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store whose owner started case `l1` (waiting for its approval) and `gone` (cancelled), then closed."""
    path = tmp_path / "loans.db"
    monkeypatch.setenv("LOANS_LOG", str(tmp_path / "runs.jsonl"))

    async def prepare() -> None:
        async with Substrate(store=str(path), workflows={"loan": loan}) as sub:
            await sub.new_case("loan", {"amount": 1}, case_id="l1")
            gone = await sub.new_case("loan", {"amount": 2}, case_id="gone")
            await gone.cancel(reason="withdrawn")
            while sub.status("l1").state != "waiting_signal":  # noqa: ASYNC110 (its first effect runs first)
                await anyio.sleep(0.01)

    anyio.run(prepare)
    return path


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["signal", "l1", "aprove", '{"by": "ann"}'],
         "case 'l1' cannot take signal 'aprove': the workflow never waits for signal 'aprove' (it waits for: "
         "approve at seq[1].wait); the case waits now for signal 'approve' at seq[1].wait; check the signal name; "
         "nothing was sent"),
        (["signal", "l1", "approve", '{"by": 3}'],
         "its payload does not fit Approval (by: Input should be a valid string); send a payload that validates"),
        (["signal", "l1", "approve", "{}"], "its payload does not fit Approval (by: Field required)"),
        (["signal", "l1", "approve"], "its payload does not fit Approval ((payload): Input should be a valid "
         "dictionary or instance of Approval)"),
        (["cancel", "l1", "--region", "nowhere"], "no region 'nowhere' in this workflow (regions: none)"),
        (["cancel", "gone"], "case 'gone' cannot cancel: it has already ended (cancelled)"),
        (["signal", "gone", "approve", '{"by": "ann"}'],
         "case 'gone' cannot take signal 'approve': it has already ended (cancelled)"),
    ],
)
def test_the_command_refuses_what_the_owner_would_with_no_owner_running(
    store: Path, args: list[str], says: str
) -> None:
    """Each refusal of the summary check (and of an ended case): exit status 1, the owner's words, nothing sent."""
    ran = wfsub(args[0], str(store), *args[1:])
    assert ran.returncode == 1, ran.stderr
    assert says in " ".join(ran.stderr.split()), ran.stderr
    assert inbox(store) == []


def test_the_command_queues_a_good_input_with_no_owner_running(store: Path) -> None:
    """A signal that fits the summary is queued in the inbox while no owner runs (exit status 0)."""
    ran = wfsub("signal", str(store), "l1", "approve", '{"by": "ann"}')
    assert ran.returncode == 0, ran.stderr
    assert "queued: no Substrate owns" in ran.stderr
    assert inbox(store) == [("signal", '{"name":"approve","payload":{"by":"ann"}}')]

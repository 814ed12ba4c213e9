"""`wfsub.Client` in one process, the owning Substrate in another (SQLite and Postgres): starting, steering,
reading and awaiting cases, the program summary's refusals, idempotent starts and cancels, and no owner at all."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

import wfsub
from wfsub import CaseExists, CaseNotFound, Client, SignalRejected, Substrate
from wfsub.stores import PostgresStore, Store

from .. import _warm
from ..stores import _pg
from ._app import loan
from ._http import ROOT

STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON))]


def _where(kind: str, tmp_path: Path) -> list[str]:
    if kind == "sqlite":
        return ["sqlite", str(tmp_path / "loans.db")]
    return ["postgres", _pg.database_dsn(), _pg.new_schema()]


def _store(where: list[str]) -> Store | str:
    return where[1] if where[0] == "sqlite" else PostgresStore(where[1], schema=where[2])


@contextmanager
def owner_process(where: list[str], tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """The owning Substrate in a child process, open (it printed `ready`) until the block ends."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOANS_LOG": str(tmp_path / "runs.jsonl")}
    errors = tmp_path / "owner.err"
    with errors.open("w") as err, _warm.Popen(
        [sys.executable, "-m", "tests.processes._owner", *where], cwd=ROOT, env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=err, text=True,
    ) as child:
        assert child.stdout is not None
        assert child.stdin is not None
        try:
            line = child.stdout.readline()
            assert line.strip() == "ready", errors.read_text()[-4000:]
            yield child
        finally:
            child.stdin.close()
            child.wait(timeout=60)


async def _state_is(client: Client, case_id: str, state: str) -> None:
    with anyio.fail_after(60):
        while (await client.status(case_id)).state != state:  # noqa: ASYNC110 (another process's state: no event)
            await anyio.sleep(0.01)


@pytest.mark.parametrize("kind", STORES)
async def test_a_client_starts_steers_reads_and_awaits_cases_of_another_process(kind: str, tmp_path: Path) -> None:
    """A Client in this process starts, signals, reads and awaits a case that an owner in another process runs."""
    where = _where(kind, tmp_path)
    with owner_process(where, tmp_path):
        async with Client(_store(where)) as client:
            handle = await client.new_case("loan", {"amount": 5}, case_id="k1")
            again = await client.new_case("loan", {"amount": 5}, case_id="k1")  # a retried start: the same case
            assert again.case_id == handle.case_id == "k1"
            with pytest.raises(CaseExists, match=r"already exists with other start data \(keys that differ: 'amount'"):
                await client.new_case("loan", {"amount": 6}, case_id="k1")
            await _state_is(client, "k1", "waiting_signal")
            assert handle.status().state == "waiting_signal" and handle.data()["score"] == 5
            assert [s.case_id for s in await client.cases()] == ["k1"]

            refused = r"never waits for signal 'aprove' \(it waits for: approve at seq\[1\]\.wait\)"
            with pytest.raises(SignalRejected, match=refused):
                await client.signal("k1", "aprove", {"by": "ann"})
            with pytest.raises(SignalRejected, match=r"payload does not fit Approval \(by: Input should be a valid"):
                await client.signal("k1", "approve", {"by": 3})
            with pytest.raises(SignalRejected, match="no region 'nowhere'"):
                await client.cancel_region("k1", "nowhere")
            await handle.signal("approve", {"by": "ann"}, request_id="ok-1")
            expected = {"amount": 5, "score": 5, "approve": {"by": "ann"}, "paid": 5}
            assert await handle.result(timeout=60) == expected
            assert await (await client.handle("k1")).result() == expected == await client.data("k1")
            with pytest.raises(SignalRejected, match="cannot cancel: it has already ended"):
                await client.cancel("k1")
            with pytest.raises(CaseNotFound):
                await client.handle("nope")
            kinds = [r.kind for r in await client.journal("k1")]
            assert kinds.count("start") == 1 and kinds[-1] == "end"


async def test_a_client_queues_while_no_owner_runs_and_the_next_owner_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no owner, a client's start and signal wait in the store; the Substrate that opens it next runs them."""
    monkeypatch.setenv("LOANS_LOG", str(tmp_path / "runs.jsonl"))
    path = str(tmp_path / "loans.db")
    async with Substrate(store=path, workflows={"loan": loan}):  # registers the workflow's summary, then leaves
        pass
    async with Client(path) as client:
        await client.new_case("loan", {"amount": 3}, case_id="q1")
        with pytest.raises(SignalRejected, match="never waits for signal 'approved'"):
            await client.signal("q1", "approved", {"by": "ann"})  # refused with no owner running
        await client.signal("q1", "approve", {"by": "ann"})
        with pytest.raises(TimeoutError, match="has not ended"):
            await client.await_case("q1", timeout=0)
        async with anyio.create_task_group() as tg:
            done = anyio.Event()

            async def owner() -> None:
                async with Substrate(store=path, workflows={"loan": loan}):
                    await done.wait()

            tg.start_soon(owner)
            assert await client.await_case("q1", timeout=60) == {
                "amount": 3, "score": 3, "approve": {"by": "ann"}, "paid": 3
            }
            done.set()


async def test_two_callers_at_once_start_one_case_and_cancel_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two clients starting the same case at once get one case; two cancels with one request id apply once."""
    monkeypatch.setenv("LOANS_LOG", str(tmp_path / "runs.jsonl"))
    path = str(tmp_path / "loans.db")
    async with Substrate(store=path, workflows={"loan": loan}) as sub, Client(path) as a, Client(path) as b:
        for n in range(10):
            handles: list[Any] = []

            async def start(client: Client, n: int, handles: list[Any]) -> None:
                handles.append(await client.new_case("loan", {"amount": n}, case_id=f"t{n}"))

            async def stop(client: Client, n: int) -> None:
                await client.cancel(f"t{n}", request_id=f"stop-{n}")

            async with anyio.create_task_group() as tg:
                tg.start_soon(start, a, n, handles)
                tg.start_soon(start, b, n, handles)
                tg.start_soon(start, a, n, handles)
            assert {h.case_id for h in handles} == {f"t{n}"}
            await _state_is(a, f"t{n}", "waiting_signal")
            async with anyio.create_task_group() as tg:
                tg.start_soon(stop, a, n)
                tg.start_soon(stop, b, n)
            with pytest.raises(wfsub.CaseCancelled):
                await sub.await_case(f"t{n}", timeout=60)
            await a.cancel(f"t{n}", request_id=f"stop-{n}")  # a retry of an applied cancel: as the first returned
            kinds = [r.kind for r in await sub.journal(f"t{n}")]
            assert kinds.count("start") == 1 and kinds.count("cancel") == 1 and kinds[-1] == "end", kinds


class _Application(BaseModel):
    amount: int
    applicant: str


async def test_a_client_refuses_a_start_that_does_not_fit_the_workflows_input_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The input model's JSON Schema goes into the program summary: a client refuses a bad start with no owner
    running, with the owner's InvalidStartData wording, and starts a good one."""
    monkeypatch.setenv("LOANS_LOG", str(tmp_path / "runs.jsonl"))
    path = str(tmp_path / "loans.db")
    async with Substrate(store=path, workflows={"loan": wfsub.Workflow(loan, input=_Application)}):
        pass
    async with Client(path) as client:
        with pytest.raises(wfsub.InvalidStartData, match=r"does not fit _Application \(applicant: Field required\)"):
            await client.new_case("loan", {"amount": 3}, case_id="bad")
        with pytest.raises(CaseNotFound):
            await client.status("bad")  # nothing was written
        await client.new_case("loan", {"amount": 3, "applicant": "ann"}, case_id="good")
        assert (await client.status("good")).case_id == "good"

"""A takeover after the owning process is SIGKILLed, while callers keep using the case: a SQLite standby that
becomes the file's owner, and a Postgres node that takes over a dead node's cases. The inputs one caller sent,
each acknowledged before the next, are taken in that order whichever door took them (the inbox while another
process owned the case, the case itself once this one does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import anyio
import pytest

from wfsub import CaseCancelled, Client, Substrate
from wfsub.stores import PostgresStore

from .. import _warm
from ..stores import _pg
from ._http import ROOT
from ._takeover_owner import GATE, KILL_IN_PAY, WORKFLOWS

LEASE = 1.0  # seconds: a Postgres node's lease (a dead node's cases are taken over after about that long)

STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON))]


@contextmanager
def owner_process(argv: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[
    subprocess.Popen[str]
]:
    """The owning Substrate in a child process (it printed `ready`), killed at the end if still alive."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    errors = tmp_path / "owner.err"
    with errors.open("w") as err, _warm.Popen(
        [sys.executable, "-m", "tests.processes._takeover_owner", *argv], cwd=ROOT, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
    ) as child:
        assert child.stdout is not None
        try:
            assert child.stdout.readline().strip() == "ready", errors.read_text()[-4000:]
            yield child
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=60)


class Side:
    """This process's Substrate beside a dead owner: `moved()` says whether it owns the case now; `client_store`
    what a Client of the same store opens."""

    def __init__(self, sub: Substrate, moved: Callable[[str], Awaitable[bool]], client_store: Callable[[], object]):
        self.sub = sub
        self.moved = moved
        self.client_store = client_store


@asynccontextmanager
async def beside_an_owner(
    store: str, tmp_path: Path, *starts: str, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Side, int]]:
    """An owner process that started `starts` ("workflow:case_id"), and a Substrate of this process beside it:
    a standby of the SQLite file, or another node of the Postgres schema. Yields it and the owner's pid."""
    if store == "sqlite":
        path = tmp_path / "t.db"
        with owner_process(["sqlite", str(path)], tmp_path, env) as owner:
            async with Substrate(store=str(path), workflows=WORKFLOWS) as sub:
                assert sub.standby
                for start in starts:
                    workflow, case_id = start.split(":")
                    await sub.new_case(workflow, {}, case_id=case_id)

                async def standby_no_more(case_id: str) -> bool:
                    return not sub.standby

                yield Side(sub, standby_no_more, lambda: str(path)), owner.pid
        return
    schema, dsn = _pg.new_schema(), _pg.database_dsn()
    with owner_process(["postgres", dsn, schema, "a", str(LEASE), *starts], tmp_path, env) as owner:
        reader = PostgresStore(dsn, schema=schema, create=False)
        await reader.open(owner=False, owner_id="reader")
        try:
            async with Substrate(store=PostgresStore(dsn, schema=schema, lease_seconds=LEASE), workflows=WORKFLOWS,
                                 node_id="b") as sub:

                async def taken_over(case_id: str) -> bool:
                    row = await reader.row(case_id)
                    return row is not None and row.owner == "b"

                yield Side(sub, taken_over, lambda: PostgresStore(dsn, schema=schema, create=False)), owner.pid
        finally:
            await reader.close()


async def until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(60):
        while not predicate():  # noqa: ASYNC110 (another process's state: no event)
            await anyio.sleep(0.005)


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("last", ["signal", "cancel"])
async def test_signals_sent_one_at_a_time_across_a_takeover_are_taken_in_the_order_acknowledged(
    tmp_path: Path, store: str, last: str
) -> None:
    """One caller signals 0, 1, 2, ... (each acknowledged before the next) while the case's owner is SIGKILLed and
    this process takes the case over: the case takes them in that order (the rows left in the inbox before this
    process's own calls), and a cancel sent first after the takeover comes after all of them (none refused)."""
    async with beside_an_owner(store, tmp_path, "ordered:o") as (side, owner):
        sub = side.sub
        await until(lambda: sub.status("o").signals == ("n",))
        sent = 0
        for _ in range(10):  # taken by the owner
            await sub.signal("o", "n", sent)
            sent += 1
        os.kill(owner, signal.SIGKILL)
        with anyio.fail_after(60):
            while not await side.moved("o"):  # into the inbox, where they wait for the next owner
                await sub.signal("o", "n", sent)
                sent += 1
        if last == "cancel":  # the first input to the case itself, which this process owns now
            await sub.cancel("o", reason="last")
            with pytest.raises(CaseCancelled), anyio.fail_after(60):
                await sub.await_case("o")
        else:
            for _ in range(30):  # to the case itself, which this process owns now
                await sub.signal("o", "n", sent)
                sent += 1
            await sub.signal("o", "n", -1)
            with anyio.fail_after(60):
                await sub.await_case("o")
        journal = await sub.journal("o")
        taken = [(r.model_extra or {})["payload"] for r in journal if r.kind == "signal"]
        assert taken == list(range(sent)) + ([-1] if last == "signal" else []), f"taken out of order: {taken}"
        assert [r.kind for r in journal][-2:] == [last, "end"]
        assert sub.status("o").refused == ()


async def test_one_callers_signals_through_a_client_and_the_owner_in_turn_are_taken_in_that_order(
    tmp_path: Path,
) -> None:
    """A caller alternating between a Client (the inbox) and the owning Substrate, each call acknowledged before the
    next: the owner's own signal never overtakes the one the Client left in the inbox."""
    path = str(tmp_path / "t.db")
    async with Substrate(store=path, workflows=WORKFLOWS) as sub, Client(path) as client:
        await sub.new_case("ordered", {}, case_id="o")
        for n in range(0, 30, 2):
            await client.signal("o", "n", n)
            await sub.signal("o", "n", n + 1)
        await sub.signal("o", "n", -1)
        with anyio.fail_after(60):
            await sub.await_case("o")
        journal = await sub.journal("o")
        assert [(r.model_extra or {})["payload"] for r in journal if r.kind == "signal"] == [*range(30), -1]


@pytest.mark.parametrize("store", STORES)
async def test_updates_waiting_when_their_owner_is_sigkilled_are_all_answered_once(tmp_path: Path, store: str) -> None:
    """Twenty callers (half on this process's Substrate, half on a Client) wait on updates of cases whose owner is
    SIGKILLed among them: each gets its answer from the owner that takes the cases over, and a retry with the same
    request id gets the same answer; each update is journaled once."""
    count = 20
    starts = [f"adding:u{i}" for i in range(count)]
    async with beside_an_owner(store, tmp_path, *starts) as (side, owner):
        sub = side.sub
        async with Client(side.client_store()) as client:
            await until(lambda: all(sub.status(f"u{i}").signals == ("add",) for i in range(count)))
            answers: dict[int, object] = {}
            some = anyio.Event()

            async def call(i: int) -> None:
                door = sub if i % 2 else client
                answers[i] = await door.update(f"u{i}", "add", {"n": i}, request_id=f"r{i}", timeout=30)
                if len(answers) == 5:
                    some.set()

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for i in range(count):
                        tg.start_soon(call, i)
                    await some.wait()  # some answered by the owner, the rest waiting for it
                    os.kill(owner, signal.SIGKILL)
            assert answers == {i: {"total": i * 10} for i in range(count)}
            with anyio.fail_after(60):
                for i in range(count):
                    door = client if i % 2 else sub
                    assert await door.update(f"u{i}", "add", {"n": i}, request_id=f"r{i}") == {"total": i * 10}
            for i in range(count):
                kinds = [r.kind for r in await sub.journal(f"u{i}")]
                assert kinds == ["start", "signal"], (i, kinds)


@pytest.mark.parametrize("door", ["standby", "client"])
async def test_an_update_answered_as_its_owner_died_reaches_its_caller_while_the_case_waits_on_an_effect(
    tmp_path: Path, door: str
) -> None:
    """The owner journals an update, answers it and dies (SIGKILL) inside the effect that follows, before its row
    got the answer: the standby that takes over (and recovers other live cases after this one) computes the answer
    again and its caller (on the standby, or a Client) gets it while the effect, run again, is still running; a
    retry with the same request id too."""
    GATE["pay"] = anyio.Event()
    async with beside_an_owner("sqlite", tmp_path, env={KILL_IN_PAY: "1"}) as (side, owner):
        sub = side.sub
        await sub.new_case("paying", {}, case_id="p")
        for i in range(3):  # live cases the next owner recovers after this one
            await sub.new_case("holding", {}, case_id=f"h{i}")
        await until(lambda: sub.status("p").signals == ("add",))
        await until(lambda: all(sub.status(f"h{i}").state == "waiting_effect" for i in range(3)))
        async with Client(side.client_store()) as client:
            caller = sub if door == "standby" else client
            with anyio.fail_after(60):
                assert await caller.update("p", "add", {"n": 4}, request_id="u1") == {"total": 40}
                # answered while it pays again: by the new owner, or from the row the old one wrote before it died
                assert not GATE["pay"].is_set()
                assert await client.update("p", "add", {"n": 4}, request_id="u1") == {"total": 40}
            GATE["pay"].set()
            await until(lambda: sub.status("p").signals == ("end",))
            await sub.signal("p", "end")
            with anyio.fail_after(60):
                assert (await sub.await_case("p"))["paid"] is True
            assert [r.kind for r in await sub.journal("p")] == ["start", "signal", "effect", "signal", "end"]


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
async def test_an_update_answered_as_its_node_died_reaches_a_client_once_the_node_restarts(tmp_path: Path) -> None:
    """Postgres: a node journals an update, answers it and dies (SIGKILL) inside the effect that follows; the node
    restarted under its id recovers its cases (this one first) and the Client waiting on the update gets the answer
    while the effect, run again, is still running; a retry with the same request id too."""
    GATE["pay"] = anyio.Event()
    schema, dsn = _pg.new_schema(), _pg.database_dsn()
    starts = ["paying:p", *(f"holding:h{i}" for i in range(3))]
    argv = ["postgres", dsn, schema, "a", str(LEASE), *starts]
    with owner_process(argv, tmp_path, {KILL_IN_PAY: "1"}) as owner:
        async with Client(PostgresStore(dsn, schema=schema, create=False)) as client:
            with anyio.fail_after(60):
                while (await client.status("p")).signals != ("add",):  # noqa: ASYNC110 (another process's state)
                    await anyio.sleep(0.01)
                for i in range(3):
                    while (await client.status(f"h{i}")).state != "waiting_effect":  # noqa: ASYNC110 (as above)
                        await anyio.sleep(0.01)
            answers: list[object] = []

            async def call() -> None:
                answers.append(await client.update("p", "add", {"n": 4}, request_id="u1"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                await anyio.to_thread.run_sync(owner.wait)  # it died in `pay`, the update journaled and answered
                async with Substrate(store=PostgresStore(dsn, schema=schema, lease_seconds=LEASE),
                                     workflows=WORKFLOWS, node_id="a") as sub:
                    with anyio.fail_after(60):
                        while not answers:  # noqa: ASYNC110 (the Client's call: no event to wait on)
                            await anyio.sleep(0.01)
                        assert answers == [{"total": 40}] and not GATE["pay"].is_set()  # it pays again meanwhile
                        assert await client.update("p", "add", {"n": 4}, request_id="u1") == {"total": 40}
                    GATE["pay"].set()
                    await until(lambda: sub.status("p").signals == ("end",))
                    await sub.signal("p", "end")
                    with anyio.fail_after(60):
                        assert (await sub.await_case("p"))["paid"] is True
                    assert [r.kind for r in await sub.journal("p")] == ["start", "signal", "effect", "signal", "end"]

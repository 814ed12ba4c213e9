"""A second Substrate on a SQLite file that another one owns is a standby: it starts, steers, reads and awaits
cases through the store, runs none, and owns the file once the owner closes. (Two Substrates of one process hold
the file's lock as two processes do: the lock belongs to an open file description.)"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from wfsub import CaseExists, CaseNotFound, SignalRejected, StoreError, Substrate

from ._app import loan

DONE = {"amount": 5, "score": 5, "approve": {"by": "ann"}, "paid": 5}


@pytest.fixture(autouse=True)
def _runs_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOANS_LOG", str(tmp_path / "runs.jsonl"))


@asynccontextmanager
async def owner_until(path: str, stop: anyio.Event) -> AsyncIterator[Substrate]:
    """An owning Substrate in a task of its own, open until `stop` is set (it may close before the caller's)."""
    opened: list[Substrate] = []
    ready = anyio.Event()

    async def run() -> None:
        async with Substrate(store=path, workflows={"loan": loan}) as sub:
            opened.append(sub)
            ready.set()
            await stop.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await ready.wait()
        yield opened[0]
        stop.set()


async def until(predicate: object) -> None:
    with anyio.fail_after(30):
        while not predicate():  # type: ignore[operator]  # noqa: ASYNC110 (another Substrate's state: no event)
            await anyio.sleep(0.005)


async def test_a_standby_steers_and_reads_through_the_store_and_runs_nothing(tmp_path: Path) -> None:
    """A standby's new_case, signal, status, handle and await_case reach the owner's cases; it runs none."""
    path = str(tmp_path / "loans.db")
    async with owner_until(path, anyio.Event()) as owner, Substrate(store=path, workflows={"loan": loan}) as sub:
        assert sub.standby and not owner.standby
        handle = await sub.new_case("loan", {"amount": 5}, case_id="s1")
        assert (await sub.new_case("loan", {"amount": 5}, case_id="s1")).case_id == "s1"
        with pytest.raises(CaseExists, match="other start data"):
            await sub.new_case("loan", {"amount": 7}, case_id="s1")
        await until(lambda: sub.status("s1").state == "waiting_signal")
        with pytest.raises(SignalRejected, match="never waits for signal 'aproved'"):
            await sub.signal("s1", "aproved", {"by": "ann"})
        with pytest.raises(SignalRejected, match="does not fit Approval"):
            await handle.signal("approve", {})
        await handle.signal("approve", {"by": "ann"})
        assert await sub.await_case("s1") == DONE == await sub.handle("s1").result()
        with pytest.raises(SignalRejected, match="cannot cancel: it has already ended"):
            await sub.cancel("s1")
        with pytest.raises(CaseNotFound):
            sub.handle("nope")
        assert sub.statistics().cases_started == 0 and owner.statistics().cases_done == 1
        assert [s.case_id for s in sub.cases()] == ["s1"]


async def test_standby_false_refuses_with_a_message_naming_what_exists(tmp_path: Path) -> None:
    """standby=False on an owned file: StoreError naming the owner, the standby default and wfsub.Client."""
    path = str(tmp_path / "loans.db")
    async with owner_until(path, anyio.Event()):
        with pytest.raises(StoreError, match=f"owned by Substrate .*pid {os.getpid()}") as caught:
            async with Substrate(store=path, workflows={"loan": loan}, standby=False):
                pass
    text = str(caught.value)
    assert "owner=False" not in text and "`standby`" in text and "wfsub.Client" in text


async def test_a_standby_takes_ownership_when_the_owner_closes_and_runs_its_cases(tmp_path: Path) -> None:
    """Once the owner closes, the standby owns the file and runs the cases, an awaiter's included."""
    path = str(tmp_path / "loans.db")
    stop = anyio.Event()
    async with owner_until(path, stop), Substrate(store=path, workflows={"loan": loan}) as sub:
        await sub.new_case("loan", {"amount": 5}, case_id="t1")
        await until(lambda: sub.status("t1").state == "waiting_signal")
        result: list[object] = []

        async def wait_for_it() -> None:
            result.append(await sub.await_case("t1"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_it)
            stop.set()  # the owner closes
            await until(lambda: not sub.standby)
            await sub.signal("t1", "approve", {"by": "ann"})
        assert result == [DONE]
        assert sub.statistics().cases_done == 1


async def test_a_standby_whose_takeover_meets_a_busy_file_stays_a_standby_and_takes_over_once_it_is_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The owner ends while another connection holds the file's write lock past the busy timeout (shortened here
    to keep the test quick): the standby's takeover fails, the app's process goes on (the standby still reads and
    steers through the store), and once the lock is released the standby owns the file and runs the case."""
    import sqlite3

    from wfsub._store import _sqlite

    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT", 0.2)
    path = str(tmp_path / "loans.db")
    stop = anyio.Event()
    with caplog.at_level("WARNING", logger="wfsub"):
        async with owner_until(path, stop), Substrate(store=path, workflows={"loan": loan}) as sub:
            await sub.new_case("loan", {"amount": 5}, case_id="b1")
            await until(lambda: sub.status("b1").state == "waiting_signal")
            blocker = sqlite3.connect(path, isolation_level=None, timeout=0)
            try:
                blocker.execute("BEGIN IMMEDIATE")  # the write lock, held past the busy timeout
                stop.set()  # the owner ends
                await until(lambda: caplog.text.count("could not take ownership of the store") >= 2)
                assert sub.standby and sub.status("b1").state == "waiting_signal"
            finally:
                blocker.close()  # (its transaction rolled back: the file is free)
            await until(lambda: not sub.standby)
            await sub.signal("b1", "approve", {"by": "ann"})
            with anyio.fail_after(30):
                assert await sub.await_case("b1") == DONE
    assert "database is locked" in caplog.text


async def test_a_standby_whose_takeover_meets_a_full_disk_stays_a_standby_and_tries_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A takeover that fails as on a full disk (a store whose take_ownership raises the store's SQLITE_FULL error)
    leaves the Substrate a standby, its process running; once the disk has room it owns the file and runs the
    case an awaiter waits for."""
    from wfsub.stores import SqliteStore

    class FullDisk(SqliteStore):
        full = False
        attempts = 0

        async def take_ownership(self, owner_id: str) -> bool:
            if self.full:
                self.attempts += 1
                raise StoreError(self.path, "recording the owner failed: database or disk is full (SQLITE_FULL); "
                                 "the disk is full or the process reached its file size limit")
            return await super().take_ownership(owner_id)

    path = str(tmp_path / "loans.db")
    store = FullDisk(path)
    stop = anyio.Event()
    with caplog.at_level("WARNING", logger="wfsub"):
        async with owner_until(path, stop), Substrate(store=store, workflows={"loan": loan}) as sub:
            await sub.new_case("loan", {"amount": 5}, case_id="f1")
            await until(lambda: sub.status("f1").state == "waiting_signal")
            result: list[object] = []

            async def wait_for_it() -> None:
                result.append(await sub.await_case("f1"))

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_for_it)
                store.full = True
                stop.set()  # the owner ends
                await until(lambda: store.attempts >= 2)
                assert sub.standby
                await sub.signal("f1", "approve", {"by": "ann"})  # (to the inbox: the next owner applies it)
                store.full = False
                await until(lambda: not sub.standby)
            assert result == [DONE]
    assert "could not take ownership of the store" in caplog.text and "SQLITE_FULL" in caplog.text

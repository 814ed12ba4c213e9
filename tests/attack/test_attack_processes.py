"""Processes sharing a store, as a user meets them: a standby whose owner is SIGKILLed, a `wfsub.Client` whose
Postgres connection loses answers or the whole server, repeated request ids, and what the errors say."""

from __future__ import annotations

import contextlib
import datetime
import enum
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel, ConfigDict, Field

from wfsub import (
    CaseExists,
    CaseNotFound,
    CaseState,
    Client,
    Queue,
    SignalRejected,
    StoreError,
    Substrate,
    SubstrateClosed,
    WfsubError,
    Workflow,
    seq,
    wait,
)
from wfsub.stores import PostgresStore

from .. import _warm
from ..processes._app import loan
from ..processes._http import ROOT
from ..stores import _pg
from ..stores._proxy import PROXY_CONNECT, Proxy

needs_pg = pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
TWO_WAITS = seq(wait("go"), wait("more"))
DONE = {"amount": 5, "score": 5, "approve": {"by": "ann"}, "paid": 5}


async def until(predicate: Any) -> None:
    """Wait on a state another process or the store changes (no event to wait on), bounded against hangs."""
    with anyio.fail_after(60):
        while not await predicate():  # noqa: ASYNC110 (another process's state: no event)
            await anyio.sleep(0.005)


@contextmanager
def owner_process(path: Path, tmp_path: Path, module: str = "tests.processes._owner") -> Iterator[
    subprocess.Popen[str]
]:
    """An owning Substrate in a child process on a SQLite file (it printed `ready`): the loan service's by
    default, killed at the end if the test has not already."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LOANS_LOG": str(tmp_path / "runs.jsonl")}
    args = ["sqlite", str(path)] if module == "tests.processes._owner" else [str(path)]
    errors = tmp_path / "owner.err"
    with errors.open("w") as err, _warm.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=env,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        try:
            assert child.stdout.readline().strip() == "ready", errors.read_text()[-4000:]
            yield child
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=60)


def runs(tmp_path: Path) -> list[tuple[str, str]]:
    import json

    log = tmp_path / "runs.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return [(run["case"], run["effect"]) for run in map(json.loads, lines)]


async def test_inputs_a_standby_sends_while_its_owner_lies_sigkilled_are_applied_once_after_the_takeover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby's signal and new_case made right after the owner is SIGKILLed return, are run by the standby once
    it owns the file, and their retries (same request id, same start) change nothing."""
    monkeypatch.setenv("LOANS_LOG", str(tmp_path / "runs.jsonl"))
    path = tmp_path / "loans.db"
    with owner_process(path, tmp_path) as owner:
        async with Substrate(store=str(path), workflows={"loan": loan}) as sub:
            assert sub.standby
            await sub.new_case("loan", {"amount": 5}, case_id="k1")

            async def k1_waits() -> bool:
                return sub.status("k1").state == CaseState.WAITING_SIGNAL

            await until(k1_waits)
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(timeout=60)
            # sent in the gap: the owner is dead, the standby may not have noticed yet
            await sub.signal("k1", "approve", {"by": "ann"}, request_id="ap-1")
            await sub.new_case("loan", {"amount": 6}, case_id="k2")
            with anyio.fail_after(60):
                assert await sub.await_case("k1") == DONE
            assert not sub.standby
            await sub.signal("k1", "approve", {"by": "ann"}, request_id="ap-1")  # a retry after a lost answer
            assert (await sub.new_case("loan", {"amount": 6}, case_id="k2")).case_id == "k2"

            async def k2_waits() -> bool:
                return sub.status("k2").state == CaseState.WAITING_SIGNAL

            await until(k2_waits)
            await sub.signal("k2", "approve", {"by": "bob"})
            with anyio.fail_after(60):
                assert (await sub.await_case("k2"))["paid"] == 6
            kinds = [r.kind for r in await sub.journal("k1")]
            assert kinds == ["start", "effect", "signal", "effect", "end"], kinds
            assert [r.kind for r in await sub.journal("k2")].count("start") == 1
    assert sorted(runs(tmp_path)) == [("k1", "disburse"), ("k1", "score"), ("k2", "disburse"), ("k2", "score")]


@pytest.mark.parametrize("door", ["owner", "client"])
async def test_a_cancel_that_reuses_a_signals_request_id_is_applied_or_refused_never_dropped(
    door: str, tmp_path: Path
) -> None:
    """A cancel sent with a request_id a signal of the same case already used either cancels or raises."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows={"f": TWO_WAITS}) as sub, Client(path) as client:
        caller: Any = sub if door == "owner" else client
        await caller.new_case("f", {}, case_id="a")
        await caller.signal("a", "go", {}, request_id="r1")

        async def more() -> bool:
            return (await client.status("a")).signals == ("more",)

        await until(more)
        try:
            await caller.cancel("a", reason="stop", request_id="r1")
        except WfsubError:
            return  # refused, loudly: the caller knows nothing was cancelled
        with contextlib.suppress(SignalRejected):  # taken after the cancel (the inbox keeps the order): it ends
            await caller.signal("a", "more", {}, request_id="m1")  # the case only if the cancel was dropped
        await until(lambda: _ended(client, "a"))
        assert (await client.status("a")).state == CaseState.CANCELLED


async def _ended(client: Client, case_id: str) -> bool:
    return (await client.status(case_id)).ended_at is not None


async def test_a_cancel_of_an_ended_case_by_a_client_says_so_and_its_applied_retry_returns(tmp_path: Path) -> None:
    """A Client's cancel of an ended case raises SignalRejected; a retry of the cancel that ended it returns."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows={"f": TWO_WAITS}) as sub, Client(path) as client:
        await client.new_case("f", {}, case_id="a")
        await client.cancel("a", reason="stop", request_id="c1")
        await until(lambda: _ended(client, "a"))
        await client.cancel("a", reason="stop", request_id="c1")
        with pytest.raises(SignalRejected, match=r"case 'a' cannot cancel: it has already ended \(cancelled\)"):
            await client.cancel("a", request_id="c2")
        with pytest.raises(SignalRejected, match="it has already ended"):
            await sub.cancel("a")
        assert [r.kind for r in await client.journal("a")] == ["start", "cancel", "end"]


@needs_pg
async def test_a_clients_start_and_signal_whose_commit_answers_are_lost_apply_once() -> None:
    """A Client on Postgres whose new_case and signal lose their commit's answer returns and wrote each once."""
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    proxy = Proxy(dsn)
    try:
        async with Substrate(store=PostgresStore(dsn, schema=schema), workflows={"f": TWO_WAITS},
                             node_id="owner") as sub, Client(
            PostgresStore(proxy.dsn, schema=schema, retry_for=10, connect_timeout=PROXY_CONNECT)
        ) as client:
            await client.new_case("f", {}, case_id="a")
            proxy.drop_answers(1, after=200)
            await client.new_case("f", {}, case_id="b")
            proxy.drop_answers(1, after=200)
            await client.signal("a", "go", {}, request_id="g1")
            assert proxy.dropped == 2
            await client.signal("a", "go", {}, request_id="g1")  # the caller's own retry

            async def more() -> bool:
                return (await client.status("a")).signals == ("more",)

            await until(more)
            assert [r.kind for r in await sub.journal("a")] == ["start", "signal"]
            assert [r.kind for r in await sub.journal("b")] == ["start"]
    finally:
        proxy.down()


@needs_pg
async def test_a_clients_calls_in_an_outage_fail_naming_the_case_and_what_was_being_done() -> None:
    """With Postgres unreachable, a Client's status and cancel of a running case fail with a StoreError naming the
    case, without calling it queued; once the server is back the same calls work."""
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    proxy = Proxy(dsn)
    try:
        async with Substrate(store=PostgresStore(dsn, schema=schema), workflows={"f": TWO_WAITS},
                             node_id="owner"), Client(
            PostgresStore(proxy.dsn, schema=schema, retry_for=0.5, connect_timeout=PROXY_CONNECT)
        ) as client:
            await client.new_case("f", {}, case_id="a")
            proxy.down()
            for call in (lambda: client.status("a"), lambda: client.cancel("a", request_id="c1")):
                with pytest.raises(StoreError) as caught:
                    await call()
                words = str(caught.value)
                assert "case 'a'" in words, words
                assert "queued case 'a'" not in words and "a queued case" not in words, words
                assert "could not be reached" in words and "pg_isready" in words, words
            proxy.up()
            await client.cancel("a", request_id="c1")
            await until(lambda: _ended(client, "a"))
            assert (await client.status("a")).state == CaseState.CANCELLED
    finally:
        proxy.down()


def command(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m wfsub ARGS`, as an operator runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return _warm.command(*args, cwd=cwd, env=env)


def test_the_update_command_on_a_mistyped_path_creates_no_store_and_says_so(tmp_path: Path) -> None:
    """`wfsub update` on a path that holds no store exits 1 saying so, and leaves no new store file behind."""
    ran = command("update", "lons.db", "k1", "approve", "{}", cwd=tmp_path)
    assert ran.returncode == 1, ran
    assert "no store file here" in ran.stderr and "lons.db" in ran.stderr, ran.stderr
    assert list(tmp_path.iterdir()) == []


async def test_the_update_command_names_a_missing_case_with_the_commands_words(tmp_path: Path) -> None:
    """`wfsub update` of a case the store lacks says so and how to list the cases, as the other commands do."""
    path = tmp_path / "c.db"
    async with Substrate(store=str(path), workflows={"f": TWO_WAITS}):
        pass
    ran = command("update", str(path), "nope", "approve", "{}", cwd=tmp_path)
    assert ran.returncode == 1, ran
    assert "no case 'nope' in sqlite:///" in ran.stderr and "wfsub cases" in ran.stderr, ran.stderr
    assert "new_case()" not in ran.stderr and "retain_ended" not in ran.stderr, ran.stderr


async def test_the_cancel_command_does_not_claim_a_cancel_it_never_recorded(tmp_path: Path) -> None:
    """`wfsub cancel --request-id R` of an ended case whose id R a signal used does not say the cancel was done."""
    path = tmp_path / "c.db"
    async with Substrate(store=str(path), workflows={"f": TWO_WAITS}) as sub:
        await sub.new_case("f", {}, case_id="a")
        await sub.signal("a", "go", {}, request_id="r1")
        await sub.signal("a", "more", {}, request_id="r2")
        await sub.await_case("a")
    ran = command("cancel", str(path), "a", "--request-id", "r2", cwd=tmp_path)
    assert "recorded the cancel" not in ran.stdout + ran.stderr, ran
    assert ran.returncode == 1, ran


@pytest.fixture
def private_server() -> Iterator[Any]:
    """A Postgres server of this test's own (never the shared one), that it may crash and start again (in a
    directory of its own: pytest's are closed to the `postgres` user the server runs as under root)."""
    import shutil
    import tempfile

    from ..chaos._server import PrivateServer, ServerUnavailable

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    workdir = Path(tempfile.mkdtemp(prefix="wfsub-attack-pg-"))
    try:
        try:
            server = PrivateServer.start(workdir)
        except ServerUnavailable as exc:
            pytest.skip(str(exc))
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def test_a_clients_calls_across_a_server_crash_apply_once_and_its_awaiter_wakes(private_server: Any) -> None:
    """A Client's new_case, signal (with a request id) and await_case made while the Postgres server is down and
    started again return once it is back (or are repeated by the caller after a StoreError), and apply once."""
    store_of = lambda: PostgresStore(private_server.dsn, schema="w", retry_for=60, connect_timeout=1)  # noqa: E731
    async with Substrate(store=store_of(), workflows={"f": TWO_WAITS}, node_id="owner") as sub, Client(
        store_of()
    ) as client:
        await client.new_case("f", {}, case_id="a")
        got: dict[str, Any] = {}

        async def through_the_crash() -> None:
            for name, call in (
                ("b", lambda: client.new_case("f", {}, case_id="b")),
                ("go", lambda: client.signal("a", "go", {}, request_id="g1")),
                ("more", lambda: client.signal("a", "more", {}, request_id="m1")),
            ):
                try:
                    got[name] = await call()
                except StoreError:  # its outcome unknown: the caller repeats it, as the docs say
                    got[name] = await call()
            got["end"] = await client.await_case("a", timeout=120)

        await anyio.to_thread.run_sync(private_server.crash)
        async with anyio.create_task_group() as tg:
            tg.start_soon(through_the_crash)
            await anyio.to_thread.run_sync(private_server.start_again)
        assert got["end"] == {"go": {}, "more": {}}
        assert [r.kind for r in await sub.journal("a")] == ["start", "signal", "signal", "end"]
        assert [r.kind for r in await sub.journal("b")] == ["start"]

        async def b_waits() -> bool:  # (its row says so once its owner has run it to its wait: a Client reads rows)
            return (await client.status("b")).state == CaseState.WAITING_SIGNAL

        await until(b_waits)


@pytest.mark.parametrize("door", ["owner", "client"])
async def test_a_repeated_start_with_other_tags_returns_the_case_whose_tags_stand(door: str, tmp_path: Path) -> None:
    """new_case(case_id=X) again with equal data but other tags is the same start: it returns the case, whose first
    tags stand (only the workflow and the start data decide whether a start is the same; other options stand)."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows={"f": TWO_WAITS}) as sub, Client(path) as client:
        caller: Any = sub if door == "owner" else client
        await caller.new_case("f", {}, case_id="t", tags={"tenant": "acme"})
        again = await caller.new_case("f", {}, case_id="t", tags={"tenant": "globex"})
        assert again.case_id == "t"
        assert (await client.status("t")).tags == {"tenant": "acme"}
        assert [r.kind for r in await client.journal("t")] == ["start"]


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Schedule(BaseModel):
    at: datetime.datetime
    every: datetime.timedelta
    level: Level


class Named(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    user: str = Field(alias="userName")


SCHEDULED = seq(wait("plan", model=Schedule))
NAMED = seq(wait("who", model=Named))


async def test_a_client_with_no_owner_takes_numbers_the_model_takes_as_times_and_int_enums(tmp_path: Path) -> None:
    """A Client's check (no owner running) lets through an epoch for a datetime, seconds for a timedelta and "2"
    for an IntEnum, as the owner's model takes them; the next owner applies the signal."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows={"s": SCHEDULED}) as sub:
        await sub.new_case("s", {}, case_id="a")
    async with Client(path) as client:
        await client.signal("a", "plan", {"at": 1_700_000_000, "every": 3600, "level": "2"})
    async with Substrate(store=path, workflows={"s": SCHEDULED}) as sub:
        with anyio.fail_after(60):
            data = await sub.await_case("a")
        assert sub.status("a").refused == ()
    assert data["plan"] == {"at": "2023-11-14T22:13:20Z", "every": "PT1H", "level": 2}  # the model's dump


async def test_a_client_with_no_owner_takes_a_field_by_name_when_the_model_populates_by_name(tmp_path: Path) -> None:
    """A Client's check lets through {"user": ...} for a model with Field(alias="userName") and
    populate_by_name=True, as the owner's model takes it."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows={"n": NAMED}) as sub:
        await sub.new_case("n", {}, case_id="a")
    async with Client(path) as client:
        await client.signal("a", "who", {"user": "ann"})


async def test_reading_cases_after_the_substrate_closed_says_the_substrate_is_closed(tmp_path: Path) -> None:
    """After `async with Substrate` ended, status of a case it had still answers; cases, journal and the status of
    a case it never held raise SubstrateClosed (or CaseNotFound), never the store's advice to call store.open()."""
    sub = Substrate(store=str(tmp_path / "c.db"), workflows={"f": TWO_WAITS})
    async with sub:
        handle = await sub.new_case("f", {}, case_id="x")
        await handle.signal("go")
    assert sub.status("x").state == handle.status().state == CaseState.WAITING_SIGNAL
    with pytest.raises(SubstrateClosed, match="cannot list cases: the Substrate is not open"):
        sub.cases()
    with pytest.raises(SubstrateClosed, match="cannot read the journal of case 'x': the Substrate is not open"):
        await sub.journal("x")
    with pytest.raises((SubstrateClosed, CaseNotFound)) as caught:
        sub.status("nope")
    assert "store.open" not in str(caught.value) and "'nope'" in str(caught.value)


async def test_a_closed_client_says_the_client_is_closed(tmp_path: Path) -> None:
    """A Client used after its `async with` says the Client is not open and how to open it, not the Substrate."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows={"f": TWO_WAITS}):
        pass
    client = Client(path)
    async with client:
        pass
    with pytest.raises(SubstrateClosed) as caught:
        await client.status("x")
    words = str(caught.value)
    assert "the Client is not open" in words and "async with wfsub.Client(store) as client" in words, words
    assert "Substrate" not in words, words


async def _queued_and_cancelled(caller: Any, client: Client) -> None:
    """Case 'w' waits in queue 'q' behind 'r' (concurrency 1), and is cancelled there with request id c1."""
    await caller.new_case("f", {}, case_id="r", queue="q")
    await caller.new_case("f", {}, case_id="w", queue="q")
    assert (await client.status("w")).state == CaseState.QUEUED
    await caller.cancel("w", request_id="c1")


@pytest.mark.parametrize("door", ["owner", "client"])
async def test_a_start_with_the_id_of_a_case_cancelled_in_its_queue_starts_nothing_new(
    door: str, tmp_path: Path
) -> None:
    """new_case(case_id=W) where W was cancelled while queued raises CaseExists (or returns W) and starts nothing."""
    path = str(tmp_path / "c.db")
    queues = {"q": Queue(concurrency=1)}
    async with Substrate(store=path, workflows={"f": TWO_WAITS}, queues=queues) as sub, Client(path) as client:
        caller: Any = sub if door == "owner" else client
        await _queued_and_cancelled(caller, client)
        with contextlib.suppress(CaseExists):
            await caller.new_case("f", {}, case_id="w")
        assert sub.status("w").state == CaseState.CANCELLED
        assert (await client.status("w")).state == CaseState.CANCELLED


@pytest.mark.parametrize("door", ["owner", "client"])
async def test_a_retried_cancel_of_a_queued_case_returns_as_the_first_did(door: str, tmp_path: Path) -> None:
    """cancel(W, request_id=c1) again after it cancelled W in its queue returns, as a retry after a lost answer."""
    path = str(tmp_path / "c.db")
    queues = {"q": Queue(concurrency=1)}
    async with Substrate(store=path, workflows={"f": TWO_WAITS}, queues=queues) as sub, Client(path) as client:
        caller: Any = sub if door == "owner" else client
        await _queued_and_cancelled(caller, client)
        await caller.cancel("w", request_id="c1")


async def test_a_client_steering_a_case_cancelled_in_its_queue_hears_that_it_ended(tmp_path: Path) -> None:
    """A Client's cancel and signal of a case cancelled while queued raise SignalRejected saying it has ended."""
    path = str(tmp_path / "c.db")
    queues = {"q": Queue(concurrency=1)}
    async with Substrate(store=path, workflows={"f": TWO_WAITS}, queues=queues), Client(path) as client:
        await _queued_and_cancelled(client, client)
        with pytest.raises(SignalRejected, match="has already ended"):
            await client.cancel("w")
        with pytest.raises(SignalRejected, match="has already ended"):
            await client.signal("w", "go")


@pytest.mark.parametrize("door", ["owner", "client"])
async def test_a_start_with_the_id_of_a_case_waiting_in_its_queue_starts_nothing_new(
    door: str, tmp_path: Path
) -> None:
    """new_case(case_id=W) without a queue, while W waits in its queue, with other data raises CaseExists and
    starts nothing (W stays queued)."""
    path = str(tmp_path / "c.db")
    queues = {"q": Queue(concurrency=1)}
    async with Substrate(store=path, workflows={"f": TWO_WAITS}, queues=queues) as sub, Client(path) as client:
        caller: Any = sub if door == "owner" else client
        await caller.new_case("f", {}, case_id="r", queue="q")
        await caller.new_case("f", {"n": 1}, case_id="w", queue="q")
        with contextlib.suppress(CaseExists):
            await caller.new_case("f", {"n": 2}, case_id="w")
        assert sub.status("w").state == CaseState.QUEUED
        with pytest.raises(CaseNotFound):
            await client.journal("w")


async def test_a_client_sees_a_case_it_queued_from_queued_to_started_and_gets_its_handle(tmp_path: Path) -> None:
    """A Client's status of a case it started on a queue is queued, then the case's own, never CaseNotFound
    (also while the owner has claimed it and not yet written its start); its handles work while it is queued."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows={"f": TWO_WAITS}, queues={"q": Queue(concurrency=1)}) as sub, Client(
        path
    ) as client:
        await client.new_case("f", {}, case_id="r", queue="q")
        started = await client.new_case("f", {}, case_id="w", queue="q")
        assert started.status().state == CaseState.QUEUED and started.status().queue == "q"
        handle = await client.handle("w")
        assert handle.status().state == CaseState.QUEUED
        seen: list[CaseState] = []

        async def r_waits() -> bool:
            seen.append((await client.status("r")).state)
            return seen[-1] == CaseState.WAITING_SIGNAL

        await until(r_waits)
        assert set(seen) <= {CaseState.QUEUED, CaseState.RUNNING, CaseState.WAITING_SIGNAL}, seen
        await sub.cancel("r")

        async def w_started() -> bool:
            return (await client.status("w")).state in (CaseState.RUNNING, CaseState.WAITING_SIGNAL)

        await until(w_started)


class Loan(BaseModel):
    amount: int
    note: str | None = None


LOANS = {"f": Workflow(TWO_WAITS, input=Loan)}


@pytest.mark.parametrize("first", ["owner", "client"])
async def test_a_start_retried_through_the_other_door_with_the_same_data_is_the_same_case(
    first: str, tmp_path: Path
) -> None:
    """new_case(case_id=K) with the same data, made once by the owner and once by a Client (either first),
    gives one case, although the input model fills in a default."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows=LOANS) as sub, Client(path) as client:
        callers: list[Any] = [sub, client] if first == "owner" else [client, sub]
        assert (await callers[0].new_case("f", {"amount": 7}, case_id="k")).case_id == "k"

        async def journaled() -> bool:  # the first start is in the journal (a Client's: taken by the owner)
            try:
                return [r.kind for r in await sub.journal("k")][:1] == ["start"]
            except CaseNotFound:
                return False

        await until(journaled)
        assert (await callers[1].new_case("f", {"amount": 7}, case_id="k")).case_id == "k"
        assert [r.kind for r in await sub.journal("k")][:1] == ["start"]


async def test_the_commands_refusals_name_commands_not_python_calls(tmp_path: Path) -> None:
    """The refusals `wfsub retry`, `wfsub fork` and `wfsub update` print point to wfsub commands."""
    path = tmp_path / "c.db"
    async with Substrate(store=str(path), workflows={"f": TWO_WAITS}) as sub:
        await sub.new_case("f", {}, case_id="a")
    said = []
    for args in (("retry", str(path), "a"), ("fork", str(path), "a", "--at", "9"),
                 ("update", str(path), "a", "go", "{}")):
        ran = command(*args, cwd=tmp_path)
        assert ran.returncode == 1, ran
        said.append(ran.stderr)
    for words in said:
        assert "(case_id)" not in words and "signal()" not in words, words


async def test_a_client_on_a_mistyped_path_says_so_and_creates_no_store(tmp_path: Path) -> None:
    """Client("lons.db") where no store is raises StoreError saying so, and leaves no empty store behind."""
    with pytest.raises(StoreError, match="no store file here"):
        async with Client(str(tmp_path / "lons.db")):
            pass
    assert os.listdir(tmp_path) == []


async def test_a_standbys_update_sent_as_its_owner_dies_is_answered_once_after_the_takeover(tmp_path: Path) -> None:
    """An update a standby sends right after the owner is SIGKILLed is answered once the standby owns the file;
    the same request id again gets the same answer and journals nothing more."""
    from ._update_owner import ADDING

    path = tmp_path / "u.db"
    with owner_process(path, tmp_path, "tests.attack._update_owner") as owner:
        async with Substrate(store=str(path), workflows={"adding": ADDING}) as sub:
            assert sub.standby
            await sub.new_case("adding", {}, case_id="a")

            async def waits() -> bool:
                return sub.status("a").signals == ("add",)

            await until(waits)
            os.kill(owner.pid, signal.SIGKILL)
            owner.wait(timeout=60)
            with anyio.fail_after(60):
                assert await sub.update("a", "add", {"n": 4}, request_id="u1") == {"total": 40}
                assert await sub.update("a", "add", {"n": 4}, request_id="u1") == {"total": 40}
            assert not sub.standby
            assert [r.kind for r in await sub.journal("a")] == ["start", "signal"]

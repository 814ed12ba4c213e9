"""Request ids, repeated starts and a client's summary check, attacked as a user meets them: a cancel retried
once its case was suspended mid-compensation, the `wfsub` command retrying on a live case, a payload model that
coerces numbers to str, inputs of several kinds racing with one id through the owner and two clients, retries
while the journal is compacted, and lost commit answers between a client and Postgres."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from pydantic import BaseModel, ConfigDict

from wfsub import (
    CaseState,
    Client,
    SignalRejected,
    StoreError,
    Substrate,
    Workflow,
    effect,
    loop,
    reply,
    saga,
    seq,
    task,
    wait,
)
from wfsub.cli import main as cli_main
from wfsub.stores import PostgresStore

from ..stores import _pg
from ..stores._proxy import PROXY_CONNECT, Proxy

BOUND = 30.0  # seconds: a bound against a hang, not a latency requirement
needs_pg = pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
STORES = ["memory", "sqlite", pytest.param("postgres", marks=needs_pg)]
SHARED = ["sqlite", pytest.param("postgres", marks=needs_pg)]


def opener(kind: str, tmp_path: Path) -> Callable[[], Any]:
    """What each Substrate or Client of a test opens: the same store each time."""
    if kind == "memory":
        from wfsub.stores import MemoryStore

        memory = MemoryStore()
        return lambda: memory
    if kind == "sqlite":
        path = str(tmp_path / "c.db")
        return lambda: path
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return lambda: PostgresStore(dsn, schema=schema)


def node(kind: str) -> dict[str, Any]:
    return {"node_id": "n1"} if kind == "postgres" else {}


async def until(predicate: Callable[[], Any]) -> None:
    """Wait on a state the owner reaches on its own (no event to wait on), bounded against hangs."""
    with anyio.fail_after(BOUND):
        while True:
            found = predicate()
            if hasattr(found, "__await__"):
                found = await found
            if found:
                return
            await anyio.sleep(0.005)


def kinds(journal: Any) -> list[str]:
    return [r.kind for r in journal]


# -- a cancel retried on a case suspended while its first cancel compensated ----------------------------------------

def _mark(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"marked": True}


_refunds: list[str] = []


async def _refund(ctx: Mapping[str, Any]) -> None:
    _refunds.append("started")
    await anyio.sleep_forever()  # a compensation still running when the process goes away


COMPENSATING = {"f": saga((task(_mark), effect(_refund)), wait("never"))}
CHANGED = {"f": wait("other")}  # the same name, another program: the case above is suspended with it


async def test_a_cancel_retried_once_its_case_was_suspended_mid_compensation_is_not_applied_again(
    tmp_path: Path,
) -> None:
    """cancel(request_id="c1") sets a case compensating; suspended after a restart, the same call retried returns
    and writes nothing (the case stays suspended), rather than ending it at once as a second cancel does; a fresh
    cancel ends it."""
    _refunds.clear()
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows=COMPENSATING) as sub:
        await sub.new_case("f", {}, case_id="c")
        await until(lambda: sub.status("c").state == CaseState.WAITING_SIGNAL)
        await sub.cancel("c", request_id="c1")
        await until(lambda: bool(_refunds))
    async with Substrate(store=path, workflows=CHANGED) as sub:
        assert sub.status("c").state == CaseState.SUSPENDED
        await sub.cancel("c", request_id="c1")  # the first call retried: applied once already
        assert sub.status("c").state == CaseState.SUSPENDED
        assert kinds(await sub.journal("c")) == ["start", "cancel"]
        async with Client(path) as client:
            await client.cancel("c", request_id="c1")
        with pytest.raises(SignalRejected, match="request_id 'c1' was used by a cancel"):
            await sub.signal("c", "other", None, request_id="c1")
        await sub.cancel("c", request_id="c2")
        assert sub.status("c").state == CaseState.CANCELLED
        assert kinds(await sub.journal("c")) == ["start", "cancel", "cancel", "end"]


# -- the `wfsub` command retrying on a live case ---------------------------------------------------------------------

def _yes(ctx: Mapping[str, Any]) -> str:
    return "yes"


STEPS = {"f": seq(wait("go"), wait("ask", reply=_yes), wait("more"))}


async def command(*args: str) -> Any:
    """`wfsub ARGS` through click's runner, on a thread of its own (the command runs its own event loop)."""
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli_main, list(args), env={"COLUMNS": "300"}))


async def test_the_command_retrying_a_signal_on_a_live_case_sends_nothing_and_says_it_was_applied(
    tmp_path: Path,
) -> None:
    """`wfsub signal --request-id R` whose R the case took says it was applied before and writes no inbox row
    (as a Client's retry), instead of queueing one that its owner drops while saying it will be applied."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows=STEPS) as sub:
        await sub.new_case("f", {}, case_id="c")
        await sub.signal("c", "go", None, request_id="r1")
    ran = await command("signal", path, "c", "go", "--request-id", "r1", "--no-wait")
    assert ran.exit_code == 0, ran.output
    assert "was applied before" in ran.output and "queued" not in ran.output, ran.output
    ran = await command("update", path, "c", "ask", "--request-id", "r1", "--timeout", "5")
    assert ran.exit_code == 1 and "request_id 'r1' was used by a signal" in ran.output, ran.output
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM inbox").fetchone() == (0,)
    async with Substrate(store=path, workflows=STEPS) as sub:
        assert kinds(await sub.journal("c")) == ["start", "signal"]
        assert sub.status("c").refused == ()


# -- a payload model that coerces numbers to str ---------------------------------------------------------------------

class Note(BaseModel):
    model_config = ConfigDict(coerce_numbers_to_str=True)
    text: str


NOTED = {"f": Workflow(seq(wait("note", model=Note), wait("more")))}


async def test_a_client_takes_a_number_for_a_str_field_its_model_coerces_to_str(tmp_path: Path) -> None:
    """A signal payload {"text": 7} for a model with coerce_numbers_to_str is taken by the owner as "7"; a
    Client's summary check lets it through too, instead of refusing it as not a valid string."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows=NOTED) as sub, Client(path) as client:
        await sub.new_case("f", {}, case_id="a")
        await client.signal("a", "note", {"text": 7}, request_id="n1")
        await until(lambda: sub.status("a").signals == ("more",))
        assert sub.data("a")["note"] == {"text": "7"}


# -- one id, inputs of several kinds at once -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", STORES)
async def test_a_signal_an_update_and_a_cancel_racing_with_one_id_apply_exactly_one(kind: str, tmp_path: Path) -> None:
    """Through the owner, a signal, an update and a cancel sent at once with one request id: one of them is applied,
    the others raise SignalRejected naming the kind that took the id; each retried after that is a retry of the
    one applied or refused again, never applied."""
    store = opener(kind, tmp_path)
    flows = {"f": seq(wait("ask", reply=_yes), wait("more"))}
    async with Substrate(store=store(), workflows=flows, **node(kind)) as sub:
        await sub.new_case("f", {}, case_id="c")
        outcomes: dict[str, Any] = {}

        async def call(name: str, fn: Callable[[], Any]) -> None:
            try:
                outcomes[name] = await fn()
                outcomes[name] = outcomes[name] if outcomes[name] is not None else "ok"
            except SignalRejected as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "signal", lambda: sub.signal("c", "ask", None, request_id="x"))
            tg.start_soon(call, "update", lambda: sub.update("c", "ask", None, request_id="x"))
            tg.start_soon(call, "cancel", lambda: sub.cancel("c", request_id="x", compensate=False))
        won = [name for name, got in outcomes.items() if not isinstance(got, SignalRejected)]
        assert len(won) == 1, outcomes
        for name, got in outcomes.items():
            if name != won[0]:
                assert f"was used by {'an' if won[0] == 'update' else 'a'} {won[0]}" in str(got), outcomes
        journal = await sub.journal("c")
        assert sum(1 for r in journal if (r.model_extra or {}).get("request_id") == "x") == 1
        assert len([k for k in kinds(journal) if k in ("signal", "cancel")]) == 1


@pytest.mark.parametrize("kind", SHARED)
async def test_two_clients_racing_with_one_id_for_a_signal_and_a_cancel_apply_one(kind: str, tmp_path: Path) -> None:
    """Two Clients send a signal and a cancel with one request id at once: one is applied, the other refused
    naming the kind that took the id, either by its door (the winner was journaled before its check) or by the
    owner (both passed the check before either was journaled: listed in status().refused)."""
    store = opener(kind, tmp_path)
    async with AsyncExitStack() as stack:
        sub = await stack.enter_async_context(Substrate(store=store(), workflows=STEPS, **node(kind)))
        one = await stack.enter_async_context(Client(store()))
        two = await stack.enter_async_context(Client(store()))
        await sub.new_case("f", {}, case_id="c")
        await until(lambda: sub.status("c").signals == ("go",))
        at_door: list[str] = []

        async def send(call: Callable[[], Awaitable[None]]) -> None:
            try:
                await call()
            except SignalRejected as exc:
                at_door.append(str(exc))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, lambda: one.signal("c", "go", None, request_id="x"))
            tg.start_soon(send, lambda: two.cancel("c", request_id="x", compensate=False))

        def settled() -> bool:
            status = sub.status("c")
            return bool(status.refused or at_door) and (
                status.signals == ("ask",) or status.state == CaseState.CANCELLED)

        await until(settled)
        status = sub.status("c")
        refusals = [refused.reason for refused in status.refused] + at_door
        assert len(refusals) == 1, refusals
        journal = kinds(await sub.journal("c"))
        if status.state == CaseState.CANCELLED:
            assert journal == ["start", "cancel", "end"]
            assert "was used by a cancel" in refusals[0]
        else:
            assert journal == ["start", "signal"]
            assert "was used by a signal" in refusals[0]


# -- retries while the journal is compacted, and after a restart ----------------------------------------------------

def _count(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1}


ENDLESS = {"cart": loop(seq(wait("add", into="item"), task(_count)), while_=lambda d: True)}


@pytest.mark.parametrize("kind", STORES)
async def test_signals_sent_twice_at_once_while_the_journal_compacts_apply_once(kind: str, tmp_path: Path) -> None:
    """With compact_after=2, each of 12 signals sent twice at once with its id (and, on a shared store, a third
    time by a Client) is counted once; after a restart each id retried is still a retry, and a cancel with one
    is refused naming the signal."""
    store = opener(kind, tmp_path)
    async with AsyncExitStack() as stack:
        sub = await stack.enter_async_context(
            Substrate(store=store(), workflows=ENDLESS, compact_after=2, **node(kind))
        )
        client = await stack.enter_async_context(Client(store())) if kind != "memory" else None
        await sub.new_case("cart", {}, case_id="c")
        for i in range(12):
            async with anyio.create_task_group() as tg:
                for _ in range(2):
                    tg.start_soon(lambda i=i: sub.signal("c", "add", i, request_id=f"s{i}"))
                if client is not None:
                    tg.start_soon(lambda i=i: client.signal("c", "add", i, request_id=f"s{i}"))
            await until(lambda i=i: sub.data("c").get("n") == i + 1 and sub.status("c").signals == ("add",))
        assert (await sub.journal("c"))[0].kind == "snapshot"
    async with Substrate(store=store(), workflows=ENDLESS, compact_after=2, **node(kind)) as sub:
        for i in (0, 5, 11):
            await sub.signal("c", "add", i, request_id=f"s{i}")
        with pytest.raises(SignalRejected, match="request_id 's3' was used by a signal"):
            await sub.cancel("c", request_id="s3")
        await sub.signal("c", "add", 12, request_id="s12")
        await until(lambda: sub.data("c").get("n") == 13)
        assert sub.status("c").refused == ()


# -- a Client whose commit answers are lost -------------------------------------------------------------------------

async def _through(call: Callable[[], Any]) -> Any:
    """A call retried with the same request id while the store says its outcome is unknown (what a caller does)."""
    for _ in range(8):
        try:
            return await call()
        except StoreError:
            continue
    raise AssertionError("the call kept failing")


@needs_pg
@pytest.mark.parametrize("lost", [1, 3])
async def test_a_client_s_inputs_retried_after_lost_commit_answers_apply_once(lost: int) -> None:
    """A Client between which and Postgres the server's answers to writes are lost: its signal and update retried
    with their ids are applied once, the update is answered, and the ids keep their kinds (a cancel with the
    signal's id is refused)."""
    proxy = Proxy(_pg.database_dsn())
    schema = _pg.new_schema()
    try:
        async with Substrate(store=PostgresStore(_pg.database_dsn(), schema=schema), workflows=STEPS,
                             node_id="n1") as sub, Client(
            PostgresStore(proxy.dsn, schema=schema, retry_for=5, connect_timeout=PROXY_CONNECT)
        ) as client:
            await sub.new_case("f", {}, case_id="c")
            await until(lambda: sub.status("c").signals == ("go",))
            proxy.drop_answers(lost, after=200)
            await _through(lambda: client.signal("c", "go", None, request_id="s1"))
            await until(lambda: sub.status("c").signals == ("ask",))
            proxy.drop_answers(lost, after=200)
            assert await _through(lambda: client.update("c", "ask", None, request_id="u1")) == "yes"
            await until(lambda: sub.status("c").signals == ("more",))
            with pytest.raises(SignalRejected, match="request_id 's1' was used by a signal"):
                await _through(lambda: client.cancel("c", request_id="s1"))
            assert kinds(await sub.journal("c")) == ["start", "signal", "signal"]
            assert sub.status("c").refused == ()
            assert proxy.dropped >= lost
    finally:
        proxy.down()


# -- an update retried through a Client once its answer is no longer kept --------------------------------------------

ASKED = {"f": loop(wait("ask", reply=_yes), while_=lambda d: True)}


async def _asked_101_times(sub: Substrate, client: Client) -> None:
    """Case "c" of ASKED, sent updates u0..u100, and its row written after the last answer (the row written with
    the last update's record is the running one: the case waits for its signal again once the next is in)."""
    await sub.new_case("f", {}, case_id="c")
    for i in range(101):
        await sub.update("c", "ask", None, request_id=f"u{i}")
    await until(lambda: _state_is(client, "c", CaseState.WAITING_SIGNAL))


async def _state_is(client: Client, case_id: str, state: CaseState) -> bool:
    return (await client.status(case_id)).state == state


@pytest.mark.parametrize("kind", SHARED)
async def test_a_client_retrying_an_update_whose_answer_is_no_longer_kept_is_told_so(
    kind: str, tmp_path: Path
) -> None:
    """After 101 newer updates, Client.update retried with the first one's id raises SignalRejected saying its
    answer is no longer kept (as the owner's does), rather than waiting for an answer that never comes."""
    store = opener(kind, tmp_path)
    async with Substrate(store=store(), workflows=ASKED, **node(kind)) as sub, Client(store()) as client:
        await _asked_101_times(sub, client)
        with pytest.raises(SignalRejected, match="no longer kept"):
            await sub.update("c", "ask", None, request_id="u0")
        with pytest.raises(SignalRejected, match="no longer kept"):
            await client.update("c", "ask", None, request_id="u0", timeout=BOUND)
        assert await client.update("c", "ask", None, request_id="u1") == "yes"  # (still kept)


@pytest.mark.parametrize("kind", SHARED)
async def test_a_client_retrying_an_update_whose_row_predates_the_owed_list_waits_as_before(
    kind: str, tmp_path: Path
) -> None:
    """A row written before rows listed the updates owed (no `owed` in its detail) does not say an answer was
    dropped: Client.update retried with a dropped id waits for its answer until its timeout, as it always did."""
    store = opener(kind, tmp_path)
    async with Substrate(store=store(), workflows=ASKED, **node(kind)) as sub, Client(store()) as client:
        await _asked_101_times(sub, client)
        if kind == "sqlite":
            with sqlite3.connect(store()) as conn:
                conn.execute("UPDATE cases SET detail = json_remove(detail, '$.owed') WHERE case_id = 'c'")
        else:
            schema = store().schema
            _pg.fetchval(f"UPDATE {schema}.cases SET detail = (detail::jsonb - 'owed')::text WHERE case_id = 'c'")
        with pytest.raises(TimeoutError, match="the case keeps the update"):
            await client.update("c", "ask", None, request_id="u0", timeout=0.5)


class _Held:
    """An effect that runs until the test lets it finish."""

    def __init__(self) -> None:
        self.entered = anyio.Event()
        self.go = anyio.Event()

    async def __call__(self, ctx: Mapping[str, Any]) -> dict[str, Any]:
        self.entered.set()
        await self.go.wait()
        return {"done": True}


@pytest.mark.parametrize("kind", SHARED)
async def test_a_client_retrying_an_update_the_case_still_owes_waits_for_its_answer(
    kind: str, tmp_path: Path
) -> None:
    """An update taken by a wait with no reply=, owed by its thread while that thread runs an effect, is not taken
    for one whose answer was dropped (the case's row keeps an earlier update's answer, not this one's):
    Client.update retried with its id waits (its timeout says the case keeps it), then gets the `reply` step's
    answer once the effect is done."""
    held = _Held()
    flow = {"f": seq(wait("hi", reply=_yes), wait("ask"), effect(held, name="held"), reply("ask", lambda ctx: "late"),
                     wait("end"))}
    store = opener(kind, tmp_path)
    async with (
        Substrate(store=store(), workflows=flow, **node(kind)) as sub,
        Client(store()) as client,
        anyio.create_task_group() as tg,
    ):
        await sub.new_case("f", {}, case_id="c")
        assert await sub.update("c", "hi", None, request_id="h0") == "yes"  # (its row now keeps answers)
        answers: list[Any] = []

        async def first() -> None:
            answers.append(await sub.update("c", "ask", None, request_id="u0"))

        tg.start_soon(first)
        with anyio.fail_after(BOUND):
            await held.entered.wait()
        with pytest.raises(TimeoutError, match="the case keeps the update"):
            await client.update("c", "ask", None, request_id="u0", timeout=0.5)
        held.go.set()
        assert await client.update("c", "ask", None, request_id="u0", timeout=BOUND) == "late"
        await until(lambda: answers == ["late"])

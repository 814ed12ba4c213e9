"""Calls safe to repeat, made by two callers at once: a start with one case id, a signal and a cancel with one
`request_id`, sent at the same moment by two Clients, by a Client and the owning Substrate, or by the owner and a
standby, have one effect and give both callers the same answer (SQLite and Postgres)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseCancelled, Client, Substrate, effect, seq, wait
from wfsub.stores import PostgresStore

from ..stores import _pg

BOUND = 60.0  # seconds: a bound against a hang, not a latency requirement
RUNS: list[str] = []  # case ids the effect ran for (the owner runs in this process)


async def pay(ctx: Mapping[str, Any]) -> dict[str, Any]:
    RUNS.append(str(ctx["id"]))
    return {"paid": True}


FLOW = seq(wait("approve", into="approve"), effect(pay))
FLOWS = {"loan": FLOW}
STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON))]


def opener(kind: str, tmp_path: Path) -> Callable[[], Any]:
    """A new store object on one store each time it is called (each caller has its own connection)."""
    if kind == "sqlite":
        path = str(tmp_path / "loans.db")
        return lambda: path
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return lambda: PostgresStore(dsn, schema=schema)


async def both(*calls: Callable[[], Any]) -> list[object]:
    """Run the calls at once; each one's answer (its return value, or the exception it raised)."""
    answers: list[object] = [None] * len(calls)

    async def one(i: int) -> None:
        try:
            answers[i] = await calls[i]()
        except Exception as exc:  # noqa: BLE001 (an answer to compare)
            answers[i] = exc

    async with anyio.create_task_group() as tg:
        for i in range(len(calls)):
            tg.start_soon(one, i)
    return answers


@pytest.mark.parametrize("kind", STORES)
async def test_two_clients_start_signal_and_cancel_at_once_with_one_effect(kind: str, tmp_path: Path) -> None:
    """Two Clients start one case id at once (one start, both get the case), signal it with one request_id at once
    (one signal record, one payment, both return), and cancel another case with one request_id at once (one
    cancel record, both return)."""
    RUNS.clear()
    store = opener(kind, tmp_path)
    async with Substrate(store=store(), workflows=FLOWS) as sub, Client(store()) as a, Client(store()) as b:
        started = await both(lambda: a.new_case("loan", {"id": "k1"}, case_id="k1"),
                             lambda: b.new_case("loan", {"id": "k1"}, case_id="k1"))
        assert [h.case_id for h in started] == ["k1", "k1"]  # type: ignore[attr-defined]
        with anyio.fail_after(BOUND):
            while sub.status("k1").state != "waiting_signal":  # noqa: ASYNC110 (claimed from the store: no event)
                await anyio.sleep(0.01)
        answers = await both(lambda: a.signal("k1", "approve", {"by": "ann"}, request_id="sig-1"),
                             lambda: b.signal("k1", "approve", {"by": "ann"}, request_id="sig-1"))
        assert answers == [None, None]
        assert await a.await_case("k1", timeout=BOUND) == {"id": "k1", "approve": {"by": "ann"}, "paid": True}
        journal = await sub.journal("k1")
        assert [r.kind for r in journal] == ["start", "signal", "effect", "end"]
        assert RUNS == ["k1"]

        await a.new_case("loan", {"id": "k2"}, case_id="k2")
        answers = await both(lambda: a.cancel("k2", reason="withdrawn", request_id="cancel-1"),
                             lambda: b.cancel("k2", reason="withdrawn", request_id="cancel-1"))
        assert answers == [None, None]
        with pytest.raises(CaseCancelled, match="withdrawn"):
            await b.await_case("k2", timeout=BOUND)
        assert [r.kind for r in await sub.journal("k2")].count("cancel") == 1
        assert RUNS == ["k1"]


@pytest.mark.parametrize("kind", STORES)
async def test_the_owner_and_a_client_signal_and_cancel_at_once_with_one_request_id(kind: str, tmp_path: Path) -> None:
    """The owning Substrate and a Client send one signal (one request_id) at once, then one cancel: each is
    applied once and both callers return."""
    RUNS.clear()
    store = opener(kind, tmp_path)
    async with Substrate(store=store(), workflows=FLOWS) as sub, Client(store()) as client:
        handle = await sub.new_case("loan", {"id": "o1"}, case_id="o1")
        answers = await both(lambda: sub.signal("o1", "approve", {"by": "bo"}, request_id="sig-o"),
                             lambda: client.signal("o1", "approve", {"by": "bo"}, request_id="sig-o"))
        assert answers == [None, None]
        assert await handle.result(timeout=BOUND) == {"id": "o1", "approve": {"by": "bo"}, "paid": True}
        assert [r.kind for r in await sub.journal("o1")] == ["start", "signal", "effect", "end"]
        assert RUNS == ["o1"]

        await sub.new_case("loan", {"id": "o2"}, case_id="o2")
        answers = await both(lambda: sub.cancel("o2", reason="gone", request_id="cancel-o"),
                             lambda: client.cancel("o2", reason="gone", request_id="cancel-o"))
        assert answers == [None, None]
        with pytest.raises(CaseCancelled, match="gone"):
            await sub.await_case("o2", timeout=BOUND)
        assert [r.kind for r in await sub.journal("o2")].count("cancel") == 1
        assert RUNS == ["o1"]


async def test_the_owner_and_a_standby_start_signal_and_cancel_at_once(tmp_path: Path) -> None:
    """On one SQLite file, the owning Substrate and a standby start one case id, signal it with one request_id and
    cancel another with one request_id at the same moments: one start, one signal, one payment, one cancel."""
    RUNS.clear()
    path = str(tmp_path / "loans.db")
    async with Substrate(store=path, workflows=FLOWS) as owner, Substrate(store=path, workflows=FLOWS) as standby:
        assert standby.standby and not owner.standby
        started = await both(lambda: owner.new_case("loan", {"id": "s1"}, case_id="s1"),
                             lambda: standby.new_case("loan", {"id": "s1"}, case_id="s1"))
        assert [h.case_id for h in started] == ["s1", "s1"]  # type: ignore[attr-defined]
        answers = await both(lambda: owner.signal("s1", "approve", {"by": "cy"}, request_id="sig-s"),
                             lambda: standby.signal("s1", "approve", {"by": "cy"}, request_id="sig-s"))
        assert answers == [None, None]
        assert await standby.await_case("s1", timeout=BOUND) == {"id": "s1", "approve": {"by": "cy"}, "paid": True}
        assert [r.kind for r in await owner.journal("s1")] == ["start", "signal", "effect", "end"]
        assert RUNS == ["s1"]

        await standby.new_case("loan", {"id": "s2"}, case_id="s2")
        answers = await both(lambda: owner.cancel("s2", reason="gone", request_id="cancel-s"),
                             lambda: standby.cancel("s2", reason="gone", request_id="cancel-s"))
        assert answers == [None, None]
        with pytest.raises(CaseCancelled, match="gone"):
            await owner.await_case("s2", timeout=BOUND)
        assert [r.kind for r in await owner.journal("s2")].count("cancel") == 1
        assert RUNS == ["s1"]

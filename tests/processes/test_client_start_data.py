"""A case a Client queued starts with the data its owner would have given it: the owner validates the queued start
data through the workflow's input model when it first brings the case back (defaults filled in, values coerced),
and fails at once, with a message naming the field, a case whose data the model refuses although its JSON Schema
let it through (SQLite and Postgres)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel, field_validator

from wfsub import CaseFailed, Client, SignalRejected, Substrate, Workflow, seq, task, wait
from wfsub.stores import PostgresStore

from ..stores import _pg

BOUND = 60.0  # seconds: a bound against a hang, not a latency requirement
STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON))]


class Loan(BaseModel):
    amount: int
    currency: str = "EUR"

    @field_validator("amount")
    @classmethod
    def even(cls, value: int) -> int:  # a rule a JSON Schema does not carry: only the model itself checks it
        if value % 2:
            raise ValueError("must be even")
        return value


def booked(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"booked": f"{ctx['amount']} {ctx['currency']}", "amount_type": type(ctx["amount"]).__name__}


FLOWS = {"loan": Workflow(seq(wait("go"), task(booked)), input=Loan)}


def opener(kind: str, tmp_path: Path) -> Callable[[], Any]:
    if kind == "sqlite":
        path = str(tmp_path / "loans.db")
        return lambda: path
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return lambda: PostgresStore(dsn, schema=schema)


async def until_state(client: Client, case_id: str, *states: str) -> str:
    with anyio.fail_after(BOUND):
        while (state := (await client.status(case_id)).state) not in states:  # noqa: ASYNC110 (another's state)
            await anyio.sleep(0.01)
    return state


@pytest.mark.parametrize("kind", STORES)
async def test_a_client_queued_start_gets_the_input_models_dump(kind: str, tmp_path: Path) -> None:
    """Queued as {"amount": "4"}: the case runs on {"amount": 4, "currency": "EUR"} as an owner's own start would;
    the start record keeps what was sent, and the client's retried start is still the same case."""
    store = opener(kind, tmp_path)
    async with Substrate(store=store(), workflows=FLOWS, node_id="n1") as sub, Client(store()) as client:
        await client.new_case("loan", {"amount": "4"}, case_id="q1")
        await until_state(client, "q1", "waiting_signal")
        assert sub.data("q1") == {"amount": 4, "currency": "EUR"}
        again = await client.new_case("loan", {"amount": "4"}, case_id="q1")  # a retry after a lost answer
        assert again.case_id == "q1"
        await client.signal("q1", "go")
        assert await client.await_case("q1", timeout=BOUND) == {
            "amount": 4, "currency": "EUR", "go": None, "booked": "4 EUR", "amount_type": "int",
        }
        start = (await sub.journal("q1"))[0].model_extra or {}
        assert start["data"] == {"amount": 4, "currency": "EUR"} and start["sent"] == {"amount": "4"}
        own = await sub.new_case("loan", {"amount": "4"}, case_id="o1")  # the owner's own start: the same data
        assert own.data() == {"amount": 4, "currency": "EUR"}


@pytest.mark.parametrize("kind", STORES)
async def test_a_client_queued_start_the_model_refuses_fails_before_it_runs(kind: str, tmp_path: Path) -> None:
    """Queued as {"amount": 3} (the schema takes it; the model's validator does not): the owner fails the case
    before it runs, and awaiting it raises CaseFailed naming the field, the rule and what to do."""
    store = opener(kind, tmp_path)
    async with Substrate(store=store(), workflows=FLOWS, node_id="n1") as sub, Client(store()) as client:
        await client.new_case("loan", {"amount": 3}, case_id="bad")
        awaited: list[BaseException] = []

        async def owner_awaits() -> None:
            try:
                await sub.await_case("bad", timeout=BOUND)
            except CaseFailed as exc:
                awaited.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(owner_awaits)
            with pytest.raises(CaseFailed) as failed:
                await client.await_case("bad", timeout=BOUND)
        says = str(failed.value)
        assert "case 'bad' of workflow 'loan' was queued with data that does not fit Loan (amount: Value error, " \
               "must be even); its owner failed it before it ran: start a new case with data that validates " \
               "against Loan" in says, says
        assert [str(e) for e in awaited] == [says]
        assert [r.kind for r in await sub.journal("bad")] == ["start", "end"]
        status = await client.status("bad")
        assert status.state == "failed" and status.failure is not None and status.failure.type == "InvalidStartData"
        with pytest.raises(SignalRejected, match="it has already ended"):
            await client.signal("bad", "go")

"""A start repeated with the same data is the same start whichever door took each: the owner, a standby or a
Client, although the workflow's input model fills in defaults (the `start` record keeps the data as sent, as
`sent`, where the model's dump differs). Other data is refused naming the keys that differ, and a start record
from before `sent` was kept compares as its data alone (SQLite, Postgres, and memory for the owner's own door)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import BaseModel

from wfsub import CaseExists, CaseNotFound, Client, Queue, Substrate, Workflow, seq, wait
from wfsub.stores import MemoryStore, PostgresStore

from ..stores import _pg

BOUND = 60.0  # seconds: a bound against a hang, not a latency requirement
STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON))]


class Loan(BaseModel):
    amount: int
    note: str | None = None


FLOWS = {"f": Workflow(seq(wait("go"), wait("more")), input=Loan)}
QUEUES = {"q": Queue(concurrency=4)}
DUMP = {"amount": 7, "note": None}


def opener(kind: str, tmp_path: Path) -> Callable[[], Any]:
    if kind == "sqlite":
        path = str(tmp_path / "c.db")
        return lambda: path
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    return lambda: PostgresStore(dsn, schema=schema)


@asynccontextmanager
async def doors(kind: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """The owner, a Client and (SQLite) a standby Substrate of one store, by name."""
    store = opener(kind, tmp_path)
    async with Substrate(store=store(), workflows=FLOWS, queues=QUEUES, node_id="n1") as owner, Client(
        store()
    ) as client:
        found: dict[str, Any] = {"owner": owner, "client": client}
        if kind != "sqlite":
            yield found
            return
        async with Substrate(store=store(), workflows=FLOWS, queues=QUEUES) as standby:
            assert standby.standby
            yield {**found, "standby": standby}


async def started(owner: Substrate, case_id: str) -> dict[str, Any]:
    """The case's start record once its owner has given it the model's dump (a queued start: once it took it)."""
    with anyio.fail_after(BOUND):
        while True:
            try:
                records = await owner.journal(case_id)
            except CaseNotFound:
                records = []
            start = (records[0].model_extra or {}) if records else {}
            if start.get("data") == DUMP:
                return start
            await anyio.sleep(0.01)


PAIRS = [(first, then) for first in ("owner", "standby", "client") for then in ("owner", "standby", "client")]


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize(("first", "then"), PAIRS)
async def test_a_start_retried_through_any_door_with_the_same_data_is_the_same_case(
    kind: str, first: str, then: str, tmp_path: Path
) -> None:
    """new_case(case_id=K, {"amount": 7}) through one door, then again through another (or the same), gives one
    case starting on the model's dump; its start record keeps {"amount": 7} as `sent`."""
    async with doors(kind, tmp_path) as by:
        if first not in by or then not in by:
            pytest.skip("a standby is a SQLite door")
        assert (await by[first].new_case("f", {"amount": 7}, case_id="k")).case_id == "k"
        assert (await by[then].new_case("f", {"amount": 7}, case_id="k")).case_id == "k"
        start = await started(by["owner"], "k")
        assert start["sent"] == {"amount": 7}
        assert (await by[then].new_case("f", {"amount": 7}, case_id="k")).case_id == "k"  # once it is taken too
        assert [r.kind for r in await by["owner"].journal("k")] == ["start"]


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("first", ["owner", "client"])
async def test_a_start_through_the_other_door_with_other_data_names_the_key_that_differs(
    kind: str, first: str, tmp_path: Path
) -> None:
    """A retry with {"amount": 8} of a start made with {"amount": 7} raises CaseExists naming 'amount' (not the
    default the model filled in), through either door."""
    async with doors(kind, tmp_path) as by:
        await by[first].new_case("f", {"amount": 7}, case_id="k")
        await started(by["owner"], "k")
        for door in ("owner", "client"):
            with pytest.raises(CaseExists, match=r"other start data \(keys that differ: 'amount'\)"):
                await by[door].new_case("f", {"amount": 8}, case_id="k")


@pytest.mark.parametrize("kind", STORES)
async def test_a_start_the_owner_queued_keeps_what_was_sent_for_a_client_retry(kind: str, tmp_path: Path) -> None:
    """A start the owner puts on a queue with {"amount": 7} keeps that as `sent` in the queue item and then in the
    case's start record, so a Client's retry once it started is the same case."""
    async with doors(kind, tmp_path) as by:
        owner, client = by["owner"], by["client"]
        await owner.new_case("f", {"amount": 7}, case_id="k", queue="q")
        start = await started(owner, "k")
        assert start["sent"] == {"amount": 7}
        assert (await client.new_case("f", {"amount": 7}, case_id="k")).case_id == "k"
        assert (await owner.new_case("f", {"amount": 7}, case_id="k", queue="q")).case_id == "k"


@pytest.mark.parametrize("kind", STORES)
async def test_the_owner_retrying_a_client_start_compares_it_as_its_model_reads_it(kind: str, tmp_path: Path) -> None:
    """A Client's start with {"amount": "7"} retried by the owner with {"amount": 7} (which its model reads the same)
    is the same case whether or not the owner has taken the Client's start yet; a Client's retry with
    {"amount": 7} is another start (a Client compares the data as sent)."""
    async with doors(kind, tmp_path) as by:
        owner, client = by["owner"], by["client"]
        await client.new_case("f", {"amount": "7"}, case_id="k")
        assert (await owner.new_case("f", {"amount": 7}, case_id="k")).case_id == "k"
        await started(owner, "k")
        assert (await owner.new_case("f", {"amount": 7}, case_id="k")).case_id == "k"
        with pytest.raises(CaseExists, match="other start data"):
            await client.new_case("f", {"amount": 7}, case_id="k")


@pytest.mark.parametrize("kind", STORES)
async def test_a_start_record_without_sent_compares_as_its_data(kind: str, tmp_path: Path) -> None:
    """A start record written before `sent` was kept (its data the model's dump): the owner's retry with
    {"amount": 7} is the same case, as is a Client's with the dump; a Client's with {"amount": 7} is refused as
    before, naming the default's key."""
    async with doors(kind, tmp_path) as by:
        owner, client = by["owner"], by["client"]
        await owner.new_case("f", {"amount": 7}, case_id="k")
        store = owner._store
        assert store is not None
        loaded = await store.load("k")
        assert loaded is not None
        old = {k: v for k, v in loaded.start.items() if k != "sent"}
        await store.replace_start("k", old)
        assert "sent" not in ((await owner.journal("k"))[0].model_extra or {})
        assert (await owner.new_case("f", {"amount": 7}, case_id="k")).case_id == "k"
        assert (await client.new_case("f", DUMP, case_id="k")).case_id == "k"
        with pytest.raises(CaseExists, match=r"keys that differ: 'note'"):
            await client.new_case("f", {"amount": 7}, case_id="k")


async def test_an_owners_start_keeps_sent_only_where_the_model_changed_the_data() -> None:
    """On a memory store: {"amount": 7} is kept as `sent`, the full dump is not (nothing differs); a retry with
    either spelling, directly or through a queue, is the same case."""
    async with Substrate(store=MemoryStore(), workflows=FLOWS, queues=QUEUES) as sub:
        await sub.new_case("f", {"amount": 7}, case_id="a")
        await sub.new_case("f", DUMP, case_id="b")
        assert ((await sub.journal("a"))[0].model_extra or {})["sent"] == {"amount": 7}
        assert "sent" not in ((await sub.journal("b"))[0].model_extra or {})
        for case_id in ("a", "b"):
            for data in ({"amount": 7}, DUMP, Loan(amount=7)):
                assert (await sub.new_case("f", data, case_id=case_id)).case_id == case_id
                assert (await sub.new_case("f", data, case_id=case_id, queue="q")).case_id == case_id
        await sub.new_case("f", {"amount": 7}, case_id="c", queue="q")
        assert (await started(sub, "c"))["sent"] == {"amount": 7}
        with pytest.raises(CaseExists, match=r"keys that differ: 'amount'"):
            await sub.new_case("f", {"amount": 8}, case_id="c", queue="q")


@pytest.mark.parametrize("kind", STORES)
@pytest.mark.parametrize("first", ["owner", "client"])
async def test_a_queued_start_repeated_by_a_client_is_the_same_case(kind: str, first: str, tmp_path: Path) -> None:
    """A Client's new_case(queue="q") repeated with the same data returns the case (queued or started; its first
    options stand), and with other data raises CaseExists naming the key, as a Substrate's does."""
    async with doors(kind, tmp_path) as by:
        owner, client = by["owner"], by["client"]
        await by[first].new_case("f", {"amount": 7}, case_id="k", queue="q", tags={"t": "1"})
        assert (await client.new_case("f", {"amount": 7}, case_id="k", queue="q", priority=3)).case_id == "k"
        await started(owner, "k")
        assert (await client.new_case("f", {"amount": 7}, case_id="k", queue="q")).case_id == "k"
        with pytest.raises(CaseExists, match=r"keys that differ: 'amount'"):
            await client.new_case("f", {"amount": 8}, case_id="k", queue="q")
        assert (await client.status("k")).tags == {"t": "1"}

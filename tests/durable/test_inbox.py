"""Outside writers: inputs put in the store's inbox from another store object opened with owner=False (as the
`wfsub` command will) reach the owning Substrate's cases and are journaled with their request ids; refused ones are
kept and marked with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from wfsub import CaseCancelled, SignalRejected, StoreError, Substrate, effect, mi, saga, scope, seq, task, wait
from wfsub._store import CaseWrite
from wfsub.stores import InboxRow, SqliteStore, Store

from ._util import eventually, field, kinds, outside, wait_all_blocked

BOUND = 30.0  # seconds: a bound against a hang, not a latency requirement


async def book(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"booked": True}


async def unbook(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"unbooked": True}


def done(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"done": True}


FLOWS = {
    "wait": seq(wait("go", into="go"), task(done)),
    "saga": seq(saga((effect(book), effect(unbook)), wait("go")), task(done)),
    "region": seq(scope("r", wait("never"), on_cancel=task(lambda c: {"on_cancel": True})), task(done)),
    "complete": seq(mi(wait("ok", into="ok"), count=2, name="m", collect="out"), task(done)),
    "dynamic": seq(mi(wait("ok", into="ok"), count=1, dynamic=True, name="m", collect="out"), task(done)),
}


async def taken(cli: Store, inbox_id: int) -> None:
    """Wait until the owner has moved the inbox row into its case's journal (the row is gone)."""
    async def gone() -> bool:
        row = await cli.inbox_row(inbox_id)
        assert row is None or row.refused is None, row
        return row is None

    await eventually(gone, BOUND, 0.02)


async def settled(cli: Store, inbox_id: int) -> bool:
    """The owner took the inbox row (it is gone) or refused it (it is marked)."""
    row = await cli.inbox_row(inbox_id)
    return row is None or row.refused is not None


async def refused(cli: Store, inbox_id: int) -> InboxRow:
    with anyio.fail_after(BOUND):
        while True:
            row = await cli.inbox_row(inbox_id)
            assert row is not None, "a refused input must be kept"
            if row.refused is not None:
                return row
            await anyio.sleep(0.02)


async def test_every_kind_of_outside_input_reaches_its_case(tmp_path: Path) -> None:
    """Every kind of outside inbox input reaches its case and is journaled with its request id."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="earlier")
        await wait_all_blocked()
    async with Substrate(store=path, workflows=FLOWS) as sub:
        for flow in ("wait", "saga", "region", "complete", "dynamic"):
            await sub.new_case(flow, {}, case_id=flow)
        await wait_all_blocked()
        async with outside(SqliteStore(path)) as cli:
            puts = [
                ("earlier", "signal", {"name": "go", "payload": {"from": "cli"}}, "r-earlier"),
                ("wait", "signal", {"name": "go", "payload": [1, 2]}, "r-wait"),
                ("saga", "cancel", {"reason": "ops said so", "compensate": True}, "r-saga"),
                ("region", "cancel_region", {"region": "r"}, "r-region"),
                ("complete", "complete_region", {"region": "m"}, "r-complete"),
                ("dynamic", "add_instances", {"region": "m", "items": ["extra"]}, "r-add"),
                ("dynamic", "close_instances", {"region": "m"}, "r-close"),
            ]
            ids = [await cli.inbox_put(cid, kind, body, request_id=rid, created_at=1.0)
                   for cid, kind, body, rid in puts]
            for inbox_id in ids:
                await taken(cli, inbox_id)
        await sub.signal("dynamic", "ok", 1)
        await sub.signal("dynamic", "ok", 2)
        assert await sub.await_case("earlier") == {"go": {"from": "cli"}, "done": True}
        assert await sub.await_case("wait") == {"go": [1, 2], "done": True}
        with pytest.raises(CaseCancelled, match="ops said so"):
            await sub.await_case("saga")
        assert await sub.await_case("region") == {"on_cancel": True, "done": True}
        assert await sub.await_case("complete") == {"out": [None, None], "done": True}
        assert await sub.await_case("dynamic") == {"out": [{"ok": 1}, {"ok": 2}], "done": True}
        saga_journal = await sub.journal("saga")
        assert kinds(saga_journal) == ["start", "effect", "cancel", "effect", "end"]
        for cid, kind, _, rid in puts:
            records = [r for r in await sub.journal(cid) if r.kind == kind]
            assert [field(r, "request_id") for r in records] == [rid], (cid, kind, records)


async def test_refused_outside_inputs_are_kept_and_marked(tmp_path: Path) -> None:
    """Refused outside inputs stay in the inbox, marked with the reason; the case is unharmed."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="ended")
        await sub.signal("ended", "go", 0)
        await sub.await_case("ended")
    async with Substrate(store=path, workflows=FLOWS, max_payload_bytes=100) as sub:
        await sub.new_case("wait", {}, case_id="c")
        await wait_all_blocked()
        async with outside(SqliteStore(path)) as cli:
            cases = [
                ("nobody", "signal", {"name": "go"}, "no case 'nobody'"),
                ("c", "signal", {"name": "og"}, "og"),
                ("c", "signal", {"name": "go", "payload": "x" * 500}, "max_payload_bytes"),
                ("c", "signal", {"payload": 1}, "name"),
                ("c", "teleport", {}, "teleport"),
                ("ended", "signal", {"name": "go"}, "ended"),
            ]
            for cid, kind, body, why in cases:
                inbox_id = await cli.inbox_put(cid, kind, body, request_id=None, created_at=1.0)
                row = await refused(cli, inbox_id)
                assert why in (row.refused or ""), (kind, body, row.refused)
        assert kinds(await sub.journal("c")) == ["start"]
        await sub.signal("c", "go", "direct")
        assert await sub.await_case("c") == {"go": "direct", "done": True}


async def test_an_outside_signal_and_a_direct_one_with_the_same_request_id_apply_once(tmp_path: Path) -> None:
    """The same request_id through the inbox and through Substrate.signal: one signal record, applied once."""
    path = str(tmp_path / "cases.db")
    flows = {"two": seq(wait("go", into="first"), wait("go", into="second"))}
    async with Substrate(store=path, workflows=flows) as sub:
        await sub.new_case("two", {}, case_id="c")
        await sub.signal("c", "go", "direct", request_id="same")
        async with outside(SqliteStore(path)) as cli:
            inbox_id = await cli.inbox_put("c", "signal", {"name": "go", "payload": "cli"}, request_id="same",
                                           created_at=1.0)
            await taken(cli, inbox_id)
        await sub.signal("c", "go", "third")
        assert await sub.await_case("c") == {"first": "direct", "second": "third"}


async def test_an_outside_signal_to_a_case_that_just_ended_is_refused_not_fatal(tmp_path: Path) -> None:
    """An outside signal to a case that ended in this run is refused and marked; the Substrate goes on."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="c")
        await sub.signal("c", "go", 1)
        await sub.await_case("c")
        async with outside(SqliteStore(path)) as cli:
            inbox_id = await cli.inbox_put("c", "signal", {"name": "go"}, request_id=None, created_at=1.0)
            row = await refused(cli, inbox_id)
        assert "ended" in (row.refused or "")
        await sub.new_case("wait", {}, case_id="after")
        await sub.signal("after", "go", 2)
        assert await sub.await_case("after") == {"go": 2, "done": True}


async def test_outside_add_instances_with_items_that_are_not_a_list_is_refused(tmp_path: Path) -> None:
    """Outside add_instances whose items are not a list is refused and marked; the case is unharmed after restart."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("dynamic", {}, case_id="c")
        await wait_all_blocked()
        async with outside(SqliteStore(path)) as cli:
            inbox_id = await cli.inbox_put("c", "add_instances", {"region": "m", "items": "ab"}, request_id=None,
                                           created_at=1.0)
            await eventually(lambda: settled(cli, inbox_id), BOUND, 0.02)
            row = await cli.inbox_row(inbox_id)
            assert row is not None and "sequence" in (row.refused or "")  # got: the row was taken (journaled)
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.signal("c", "ok", 1)  # raised TypeError from the replay; the one instance ends: the join fires
        assert await sub.await_case("c") == {"out": [{"ok": 1}], "done": True}


async def test_outside_add_instances_without_items_is_refused(tmp_path: Path) -> None:
    """Outside add_instances with no items is refused and marked; the case goes on."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("dynamic", {}, case_id="c")
        await wait_all_blocked()
        async with outside(SqliteStore(path)) as cli:
            inbox_id = await cli.inbox_put("c", "add_instances", {"region": "m"}, request_id=None, created_at=1.0)
            await eventually(lambda: settled(cli, inbox_id), BOUND, 0.02)
            row = await cli.inbox_row(inbox_id)
        assert sub.status("c").state == "waiting_signal", sub.status("c").error  # got: failed
        assert row is not None and row.refused


class _LockedOnce(SqliteStore):
    """A SqliteStore whose first commit that moves inbox rows fails as a write lock held past the busy timeout does."""

    failed = 0

    async def write(self, change: CaseWrite, *, wait: bool = True) -> list[bool]:
        if change.inbox_done and not self.failed:
            self.failed += 1
            raise StoreError(self.url, "database is locked: another connection held the write lock too long")
        return await super().write(change, wait=wait)


async def test_an_outside_input_whose_commit_failed_is_handed_over_again_and_applied_once(tmp_path: Path) -> None:
    """An inbox input the case failed to commit (StoreError) is handed to it again at a later poll, applied once."""
    path = tmp_path / "cases.db"
    store = _LockedOnce(path)
    async with Substrate(store=store, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="c")
        await wait_all_blocked()
        async with outside(SqliteStore(path)) as cli:
            inbox_id = await cli.inbox_put("c", "signal", {"name": "go", "payload": 7}, request_id=None,
                                           created_at=1.0)
            await taken(cli, inbox_id)
        assert store.failed == 1
        assert await sub.await_case("c") == {"go": 7, "done": True}
        assert kinds(await sub.journal("c")) == ["start", "signal", "end"]


async def test_a_signal_repeated_with_its_applied_request_id_answers_as_the_first_also_once_it_ended(
    tmp_path: Path,
) -> None:
    """signal() again with the request_id of the signal that ended the case returns as the first call did."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="c1")
        await sub.signal("c1", "go", 1, request_id="r1")
        assert await sub.await_case("c1") == {"go": 1, "done": True}
        await sub.signal("c1", "go", 1, request_id="r1")
        with pytest.raises(SignalRejected, match="ended"):
            await sub.signal("c1", "go", 1, request_id="other")
    async with Substrate(store=path, workflows=FLOWS) as sub:  # the case is in the store only now
        await sub.signal("c1", "go", 1, request_id="r1")
        assert kinds(await sub.journal("c1")) == ["start", "signal", "end"]


async def test_an_outside_input_repeating_an_applied_request_id_is_taken_not_refused(tmp_path: Path) -> None:
    """An inbox input whose request_id the (ended) case applied already is taken without a record, not refused."""
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("wait", {}, case_id="c")
        await sub.signal("c", "go", 1, request_id="r1")
        await sub.await_case("c")
        async with outside(SqliteStore(path)) as cli:
            inbox_id = await cli.inbox_put("c", "signal", {"name": "go", "payload": 1}, request_id="r1",
                                           created_at=1.0)
            await taken(cli, inbox_id)
        assert kinds(await sub.journal("c")) == ["start", "signal", "end"]


async def test_an_inbox_input_met_while_its_owner_closes_stays_for_the_next_owner(tmp_path: Path) -> None:
    """An inbox row the router hands over as its Substrate closes is left in the inbox, not refused as "not open"
    (a refusal is for good): the store's next owner applies it."""
    from wfsub import Client

    flows = {"w": seq(wait("go"), task(lambda c: {"done": True}, name="done"))}
    path = tmp_path / "cases.db"
    async with Substrate(store=path, workflows=flows) as sub:
        await sub.new_case("w", {}, case_id="c")
        await eventually(lambda: sub.status("c").state == "waiting_signal")
        table = sub._table
        assert table.store is not None and table.router is not None
        table.phase = "closing"  # (as __aexit__ sets it, before the loops beside the cases are cancelled)
        async with Client(path) as client:
            await client.signal("c", "go", request_id="late")
        [row] = await table.store.inbox_pending("c")
        await table.router.route(row)  # (the owner's own loop may hand it over too meanwhile: alike)
        assert [pending.id for pending in await table.store.inbox_pending("c")] == [row.id]
        table.phase = "open"
        assert sub.status("c").refused == ()
    async with Substrate(store=path, workflows=flows) as sub:  # (this one or the next owner applies it)
        assert (await sub.await_case("c"))["done"] is True
        assert sub.status("c").refused == ()

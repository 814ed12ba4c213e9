"""Tags, listing filters and delete, on MemoryStore, SQLite and Postgres, across a restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from wfsub import CaseNotFound, SignalRejected, Substrate, seq, task, wait

from ._util import KINDS, node, store_maker

flow = seq(task(lambda c: {"n": c.get("n", 0) + 1}))
waiting = seq(wait("go"), task(lambda c: {"went": True}))
WORKFLOWS = {"flow": flow, "waiting": waiting}


@pytest.mark.parametrize("kind", KINDS)
async def test_tags_are_in_status_and_listing_across_a_restart(kind: str, tmp_path: Path) -> None:
    """A case's tags are in its status and `cases(tags=)` finds it by every pair, in memory and after a restart."""
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), workflows=WORKFLOWS, **node(kind)) as sub:
        a = await sub.new_case("flow", case_id="a", tags={"customer": "c-17", "region": "eu"})
        await a.result()
        b = await sub.new_case("waiting", case_id="b", tags={"customer": "c-17"})
        await sub.new_case("flow", case_id="c", tags={"customer": "c-18"})
        assert sub.status("a").tags == {"customer": "c-17", "region": "eu"}
        assert b.status().tags == {"customer": "c-17"}
        assert [s.case_id for s in sub.cases(tags={"customer": "c-17"})] == ["b", "a"]
        assert [s.case_id for s in sub.cases(tags={"customer": "c-17", "region": "eu"})] == ["a"]
        assert sub.cases(tags={"customer": "nobody"}) == []
    async with Substrate(store=make(), workflows=WORKFLOWS, **node(kind)) as sub:
        assert sub.status("b").tags == {"customer": "c-17"}
        assert [s.case_id for s in sub.cases(tags={"customer": "c-17"})] == ["b", "a"]
        assert [s.case_id for s in sub.cases(tags={"customer": "c-17"}, state="waiting_signal")] == ["b"]
        assert [s.case_id for s in sub.cases(tags={"customer": "c-17"}, workflow="flow")] == ["a"]
        await sub.signal("b", "go")
        assert (await sub.await_case("b"))["went"] is True
        assert sub.status("b").tags == {"customer": "c-17"}  # its row rewritten by the end keeps its tags


@pytest.mark.parametrize("kind", KINDS)
async def test_listing_by_id_prefix_start_time_and_pages(kind: str, tmp_path: Path) -> None:
    """`id_prefix`, `started_after`/`started_before` and `before` paging filter in the store, newest first."""
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), workflows=WORKFLOWS, **node(kind)) as sub:
        for case_id in ("order-1", "order-2", "orderly", "invoice-1", "order_x", "order%y"):
            await (await sub.new_case("flow", case_id=case_id)).result()
        assert [s.case_id for s in sub.cases(id_prefix="order-")] == ["order-2", "order-1"]
        assert [s.case_id for s in sub.cases(id_prefix="order_")] == ["order_x"]  # no LIKE wildcards
        assert [s.case_id for s in sub.cases(id_prefix="order%")] == ["order%y"]
        everything = sub.cases()
        times = {s.case_id: s.started_at for s in everything}
        middle = times["orderly"]
        after = [s.case_id for s in sub.cases(started_after=middle)]
        assert after == [s.case_id for s in everything if s.started_at > middle]
        upto = [s.case_id for s in sub.cases(started_before=middle)]
        assert upto == [s.case_id for s in everything if s.started_at <= middle]
        first = sub.cases(id_prefix="order", limit=2)
        rest = sub.cases(id_prefix="order", limit=10, before=first[-1].order)
        assert [s.case_id for s in first + rest] == ["order%y", "order_x", "orderly", "order-2", "order-1"]


async def test_listing_filters_without_a_store() -> None:
    """A Substrate without a store filters its cases in memory by the same rules."""
    async with Substrate(workflows=WORKFLOWS) as sub:
        await (await sub.new_case("flow", case_id="x-1", tags={"t": "1"})).result()
        await sub.new_case("waiting", case_id="x-2", tags={"t": "2"})
        await (await sub.new_case("flow", case_id="y-1", tags={"t": "1"})).result()
        assert [s.case_id for s in sub.cases(tags={"t": "1"})] == ["y-1", "x-1"]
        assert [s.case_id for s in sub.cases(id_prefix="x-")] == ["x-2", "x-1"]
        assert sub.status("x-2").tags == {"t": "2"}


@pytest.mark.parametrize(
    ("tags", "error", "words"),
    [
        ("customer=c-17", TypeError, "tags must be a dict of str to str"),
        ({"k": 17}, TypeError, "tag 'k': tag values must be str"),
        ({"": "v"}, TypeError, "tag keys must be non-empty str"),
        ({f"k{i}": "v" for i in range(17)}, ValueError, "at most 16 tags, 17 were given"),
        ({"k": "v" * 501}, ValueError, "a value at most 500"),
    ],
)
async def test_bad_tags_are_refused_before_anything_is_written(
    tags: object, error: type[Exception], words: str, tmp_path: Path
) -> None:
    """Tags that are not str to str, or too many, are refused naming what was wrong; no case is written."""
    async with Substrate(store=str(tmp_path / "s.db"), workflows=WORKFLOWS) as sub:
        with pytest.raises(error, match=words) as caught:
            await sub.new_case("flow", case_id="bad", tags=tags)  # type: ignore[arg-type]
        assert "case 'bad'" in str(caught.value)
        assert sub.cases() == []
        with pytest.raises(error, match=words):
            sub.cases(tags=tags)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
async def test_delete_removes_an_ended_case_and_refuses_a_live_one(kind: str, tmp_path: Path) -> None:
    """`delete` removes an ended case (journal, row, tags) at once; a live one is refused and kept."""
    make = store_maker(kind, tmp_path)
    async with Substrate(store=make(), workflows=WORKFLOWS, **node(kind)) as sub:
        await (await sub.new_case("flow", case_id="done", tags={"t": "x"})).result()
        await sub.new_case("waiting", case_id="live", tags={"t": "x"})
        with pytest.raises(SignalRejected, match=r"case 'live' cannot be deleted: it has not ended \(it is "):
            await sub.delete("live")
        await sub.delete("done")
        with pytest.raises(CaseNotFound):
            sub.status("done")
        with pytest.raises(CaseNotFound):
            await sub.await_case("done")
        assert [s.case_id for s in sub.cases(tags={"t": "x"})] == ["live"]
        with pytest.raises(CaseNotFound):
            await sub.delete("done")
        await sub.cancel("live")
    async with Substrate(store=make(), workflows=WORKFLOWS, **node(kind)) as sub:
        await sub.delete("live")
        assert sub.cases() == []
        assert await sub.new_case("flow", case_id="done")  # its id is free again


async def test_delete_without_a_store() -> None:
    """Without a store, `delete` forgets an ended case and refuses a live one."""
    async with Substrate(workflows=WORKFLOWS) as sub:
        await (await sub.new_case("flow", case_id="a")).result()
        await sub.new_case("waiting", case_id="b")
        with pytest.raises(SignalRejected, match="has not ended"):
            await sub.delete("b")
        await sub.delete("a")
        with pytest.raises(CaseNotFound):
            sub.status("a")

"""Child cases (`start_case`) and signals to other cases (`signal_case`) through the runtime, on asyncio and trio,
without a store: ids, waiting or not, failures, the parent's cancel, status and listing, refusals."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from wfsub import (
    CaseFailed,
    Substrate,
    effect,
    mi,
    saga,
    scope,
    seq,
    signal_case,
    start_case,
    task,
    wait,
)

from ..durable._util import eventually

BACKENDS = ["asyncio", "trio"]

DOUBLE = task(lambda c: {"y": c["x"] * 2})
PARKED = seq(wait("go"), task(lambda c: {"got": c["go"]}))


def boom(ctx: Any) -> None:
    raise ValueError("the child broke")


FAILS = task(boom)


def run(backend: str, main: Callable[[], Awaitable[None]]) -> None:
    anyio.run(main, backend=backend)


def workflows(**extra: Any) -> dict[str, Any]:
    return {"double": DOUBLE, "parked": PARKED, "fails": FAILS, **extra}


@pytest.mark.parametrize("backend", BACKENDS)
def test_wait_merges_the_childs_result_into_a_key_or_the_data(backend: str) -> None:
    """wait=True: the step waits for the child and merges its final data `into` a key, or (into=None) the data."""
    wf = seq(
        start_case("double", data=lambda c: {"x": c["n"]}, into="first"),
        start_case("double", data=lambda c: {"x": c["first"]["y"]}),
    )

    async def main() -> None:
        async with Substrate(workflows=workflows(p=wf)) as sub:
            result = await (await sub.new_case("p", {"n": 3}, case_id="P")).result()
            assert result == {"n": 3, "first": {"x": 3, "y": 6}, "x": 6, "y": 12}
            assert sub.status("P").children == ("P/seq[0].start_case", "P/seq[1].start_case")
            child = sub.status("P/seq[1].start_case")
            assert (child.parent, child.workflow, child.state) == ("P", "double", "done")
            assert await sub.await_case("P/seq[0].start_case") == {"x": 3, "y": 6}

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_wait_stores_the_child_id_and_goes_on(backend: str) -> None:
    """wait=False: the child's id is stored `into` at once, the parent goes on and ends while the child waits."""
    wf = seq(
        start_case("parked", case_id=lambda c: f"kid-{c['n']}", wait=False, into="kid"),
        task(lambda c: {"after": True}),
    )

    async def main() -> None:
        async with Substrate(workflows=workflows(p=wf)) as sub:
            result = await (await sub.new_case("p", {"n": 7}, case_id="P")).result()
            assert result == {"n": 7, "kid": "kid-7", "after": True}
            assert sub.status("kid-7").state == "waiting_signal"
            assert sub.status("kid-7").parent == "P"
            await sub.signal("kid-7", "go", 1)
            assert await sub.await_case("kid-7") == {"go": 1, "got": 1}

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_children_of_an_mi_get_the_instance_index_in_their_id(backend: str) -> None:
    """Inside an mi each instance starts its own child, `{parent}/{path}/{index}`; cases(parent=) lists them."""
    wf = mi(start_case("double", data=lambda c: {"x": c["item"]}, into="out"), items=lambda c: [1, 2, 3],
            collect="outs")

    async def main() -> None:
        async with Substrate(workflows=workflows(p=wf)) as sub:
            result = await (await sub.new_case("p", {}, case_id="P")).result()
            assert [o["out"]["y"] for o in result["outs"]] == [2, 4, 6]
            ids = [f"P/mi.start_case/{i}" for i in range(3)]
            assert sorted(sub.status("P").children) == ids  # (in the order they started: the event loop's)
            assert sorted(s.case_id for s in sub.cases(parent="P")) == ids
            assert sub.cases(parent="nobody") == []
            assert {s.case_id for s in sub.cases(parent="P", state="done", workflow="double")} == set(ids)

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_child_fails_the_step_with_case_failed_which_on_error_catches(backend: str) -> None:
    """A failed child fails the waiting step with CaseFailed naming the child; scope(on_error=) catches it."""
    caught = scope("s", start_case("fails", case_id=lambda c: "kid"), on_error=task(lambda c: {"handled": True}))
    plain = start_case("fails", case_id=lambda c: "kid2")

    async def main() -> None:
        async with Substrate(workflows=workflows(caught=caught, plain=plain)) as sub:
            result = await (await sub.new_case("caught", {})).result()
            assert result["handled"] is True
            assert result["error"]["type"] == "CaseFailed"
            assert "'kid'" in result["error"]["message"] and "the child broke" in result["error"]["message"]
            with pytest.raises(CaseFailed) as info:
                await (await sub.new_case("plain", {})).result()
            assert "start_case('fails') raised CaseFailed: case 'kid2' failed" in str(info.value)
            assert info.value.path == "start_case"

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", ["cancel", "abandon"])
def test_cancelling_the_parent_cancels_the_child_it_waits_for_unless_abandoned(backend: str, policy: str) -> None:
    """on_parent_cancel="cancel": cancelling a waiting parent cancels the child with compensation (its saga
    undoes); "abandon" leaves the child waiting."""
    undone: list[str] = []

    async def undo(ctx: Any) -> None:
        undone.append("undo")

    async def do(ctx: Any) -> None:
        return None

    kid = saga((effect(do), effect(undo)), wait("go"))
    wf = start_case("kid", case_id=lambda c: "kid", on_parent_cancel=policy)

    async def main() -> None:
        async with Substrate(workflows=workflows(p=wf, kid=kid)) as sub:
            await sub.new_case("p", {}, case_id="P")
            await eventually(lambda: "kid" in {s.case_id for s in sub.cases()} and
                             sub.status("kid").state == "waiting_signal")
            await sub.cancel("P")
            await eventually(lambda: sub.status("P").state == "cancelled")
            if policy == "cancel":
                await eventually(lambda: sub.status("kid").state == "cancelled")
                assert undone == ["undo"]
                assert "'P'" in (sub.status("kid").cancel_reason or "")
            else:
                await eventually(lambda: sub.status("P").ended)
                assert sub.status("kid").state == "waiting_signal"
                await sub.signal("kid", "go")
                assert (await sub.await_case("kid"))["go"] is None

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_signal_case_delivers_a_signal_to_another_case(backend: str) -> None:
    """signal_case sends its payload to the case its case_id= names; the target takes it like any signal."""
    wf = signal_case("go", case_id=lambda c: c["target"], payload=lambda c: {"from": c["me"]})

    async def main() -> None:
        async with Substrate(workflows=workflows(p=wf)) as sub:
            target = await sub.new_case("parked", {}, case_id="T")
            await sub.new_case("p", {"target": "T", "me": "P"})
            assert await target.result() == {"go": {"from": "P"}, "got": {"from": "P"}}

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_signal_case_refusals_fail_the_step_with_the_refusal_text(backend: str) -> None:
    """An unknown case, an ended case, or a bad case_id= result fails the signal_case step with why."""
    to = signal_case("go", case_id=lambda c: c["target"])
    typo = signal_case("og", case_id=lambda c: "parked")

    async def main() -> None:
        async with Substrate(workflows=workflows(p=to, typo=typo)) as sub:
            await (await sub.new_case("double", {"x": 1}, case_id="ended")).result()
            await sub.new_case("parked", {}, case_id="parked")
            for target, words in (("ghost", "no case 'ghost'"), ("ended", "'ended'"), (42, "non-empty str")):
                with pytest.raises(CaseFailed) as info:
                    await (await sub.new_case("p", {"target": target})).result()
                assert words in str(info.value), str(info.value)
                assert "signal_case('go')" in str(info.value) and info.value.path == "signal_case"
            with pytest.raises(CaseFailed) as info:
                await (await sub.new_case("typo", {})).result()
            assert "never waits for signal 'og'" in str(info.value)
            assert sub.status("parked").state == "waiting_signal"

    run(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_child_id_another_case_holds_fails_the_step(backend: str) -> None:
    """start_case whose id names a case this parent did not start fails with CaseExists naming both."""
    wf = start_case("parked", case_id=lambda c: "taken")

    async def main() -> None:
        async with Substrate(workflows=workflows(p=wf)) as sub:
            await sub.new_case("parked", {}, case_id="taken")
            with pytest.raises(CaseFailed) as info:
                await (await sub.new_case("p", {}, case_id="P")).result()
            assert "CaseExists" in str(info.value) and "'taken'" in str(info.value)

    run(backend, main)

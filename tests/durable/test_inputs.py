"""Inputs are checked in one place: every door (the API, a case handle, the store's inbox, the command's
`check_input`) gives the same answer to the same input, and the vm checks each input once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from wfsub import Substrate, scope, seq, wait
from wfsub.lowlevel import Machine, check_input
from wfsub.stores import MemoryStore, SqliteStore

from ._util import kinds, outside, wait_all_blocked
from .test_inbox import refused, taken


class Approval(BaseModel):
    by: str


FLOWS = {
    "wait": seq(wait("go", into="go")),
    "approve": seq(wait("approve", into="approval", model=Approval)),
    "region": seq(scope("r", wait("never")), wait("go")),
}


@pytest.mark.parametrize("reason", ["", "  ", "\n"])
async def test_a_blank_cancel_reason_is_refused_by_every_door(tmp_path: Path, reason: str) -> None:
    """A blank reason is refused by Substrate.cancel, CaseHandle.cancel, check_input and the inbox; the case goes on."""
    with pytest.raises(TypeError, match="reason must be a non-empty str, not blank") as direct:
        check_input("cancel", {"reason": reason})
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        handle = await sub.new_case("wait", {}, case_id="c")
        await wait_all_blocked()
        with pytest.raises(TypeError, match="reason must be a non-empty str, not blank"):
            await sub.cancel("c", reason=reason)
        with pytest.raises(TypeError, match="reason must be a non-empty str, not blank"):
            await handle.cancel(reason=reason)
        async with outside(SqliteStore(path)) as cli:
            inbox_id = await cli.inbox_put("c", "cancel", {"reason": reason}, request_id=None, created_at=1.0)
            row = await refused(cli, inbox_id)
        assert str(direct.value).split(":")[0] in (row.refused or "")
        assert kinds(await sub.journal("c")) == ["start"]
        await handle.signal("go", 1)
        assert await handle.result() == {"go": 1}


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        ("signal", {"name": 3}, "signal names are str (non-empty), got int 3"),
        ("signal", {"name": ""}, "signal names are str (non-empty), got str ''"),
        ("cancel_region", {"region": None}, "region names are str (non-empty), got NoneType None"),
        ("add_instances", {"region": "r", "items": "ab"}, "add_instances takes a sequence of items"),
        ("cancel", {"compensate": "yes"}, "compensate must be True or False"),
        ("teleport", {}, "unknown input kind 'teleport'"),
    ],
)
async def test_an_input_of_the_wrong_shape_reads_the_same_from_the_api_the_inbox_and_check_input(
    tmp_path: Path, kind: str, body: dict[str, Any], message: str
) -> None:
    """The same malformed input gets the same refusal from check_input, the Substrate's methods and the inbox."""
    with pytest.raises((TypeError, ValueError), match=message.replace("(", r"\(").replace(")", r"\)")):
        check_input(kind, body)
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("region", {}, case_id="c")
        await wait_all_blocked()
        api = {
            "signal": lambda: sub.signal("c", body.get("name")),  # type: ignore[arg-type]
            "cancel_region": lambda: sub.cancel_region("c", body.get("region")),  # type: ignore[arg-type]
            "add_instances": lambda: sub.add_instances("c", "r", body["items"]),
            "cancel": lambda: sub.cancel("c", body["compensate"]),
        }.get(kind)
        if api is not None:
            with pytest.raises((TypeError, ValueError)) as info:
                await api()
            assert message in str(info.value) and "case 'c'" in str(info.value)
        async with outside(SqliteStore(path)) as cli:
            inbox_id = await cli.inbox_put("c", kind, body, request_id=None, created_at=1.0)
            row = await refused(cli, inbox_id)
        assert message in (row.refused or "") and "case 'c'" in (row.refused or "")
        assert kinds(await sub.journal("c")) == ["start"]


async def test_the_vm_checks_each_signal_once_from_every_door(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A durable signal through the API, a handle or the inbox runs Machine.check_signal once, model and all."""
    calls: list[str] = []
    checked = Machine.check_signal

    def counting(self: Machine, name: str, payload: Any = None) -> Any:
        calls.append(name)
        return checked(self, name, payload)

    monkeypatch.setattr(Machine, "check_signal", counting)
    async with Substrate(store=MemoryStore(), workflows=FLOWS) as sub:
        handle = await sub.new_case("approve", {})
        await wait_all_blocked()
        await handle.signal("approve", {"by": "ann"})
        assert calls == ["approve"]
        assert await handle.result() == {"approval": {"by": "ann"}}
        calls.clear()
        await sub.new_case("approve", {}, case_id="two")
        await wait_all_blocked()
        await sub.signal("two", "approve", Approval(by="bob"))
        assert calls == ["approve"]
        assert await sub.await_case("two") == {"approval": {"by": "bob"}}
    path = str(tmp_path / "cases.db")
    async with Substrate(store=path, workflows=FLOWS) as sub:
        await sub.new_case("approve", {}, case_id="three")
        await wait_all_blocked()
        calls.clear()
        async with outside(SqliteStore(path)) as cli:
            inbox_id = await cli.inbox_put("three", "signal", {"name": "approve", "payload": {"by": "cy"}},
                                           request_id=None, created_at=1.0)
            await taken(cli, inbox_id)
        assert await sub.await_case("three") == {"approval": {"by": "cy"}}
        assert calls == ["approve"]


async def _long_result(ctx: Any) -> dict[str, Any]:
    return {"total": 10**5000}


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_an_int_too_long_to_turn_into_text_is_refused_naming_where_it_is_by_every_door(
    kind: str, tmp_path: Path
) -> None:
    """An int of more than 4,300 digits (Python's limit for int <-> text) in start data, a signal or update payload,
    add_instances items, an effect result, a Client's input or the text of the command's and the inspector's
    PAYLOAD is refused with the path of the value and what to do, never Python's bare "Exceeds the limit"."""
    from wfsub import Client, effect, mi, task
    from wfsub.lowlevel import loads_input

    from ..durable._util import same_store

    long = 10**4300  # 4,301 digits
    said = "an int of more than 4,300 digits, longer than case data may hold .*send it as a str"
    with pytest.raises(ValueError, match=r'the payload\["n"\]\[1\]: an int of 4,301 digits, longer than case data'):
        loads_input('{"n": [1, -' + "9" * 4301 + "]}")
    assert loads_input('{"n": ' + "9" * 4300 + "}") == {"n": int("9" * 4300)}
    flows = {
        "w": seq(wait("go", reply=lambda c: "ok"),
                 mi(task(lambda c: None), items=lambda c: [], dynamic="open", name="m", join=None)),
        "e": seq(effect(_long_result, name="sum")),
    }
    store = same_store(kind, tmp_path)
    node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    async with Substrate(store=store(), workflows=flows, **node) as sub:
        with pytest.raises(TypeError, match=r'data\["n"\]: ' + said):
            await sub.new_case("w", {"n": long})
        await sub.new_case("w", {}, case_id="c")
        with pytest.raises(TypeError, match=r"signal 'go' payload\[0\]\[\"n\"\]: " + said):
            await sub.signal("c", "go", [{"n": -long}])
        with pytest.raises(TypeError, match=r"payload: " + said):
            await sub.update("c", "go", long)
        with pytest.raises(TypeError, match=r"items\[0\]: " + said):
            await sub.add_instances("c", "m", [long])
        failed = await sub.new_case("e", {})
        with pytest.raises(Exception, match=r'effect \'sum\' .*result\["total"\]: ' + said):
            await failed.result(timeout=30)
        assert await sub.update("c", "go", long - 1) == "ok"  # 4,300 digits: taken
        if kind != "memory":
            async with Client(store()) as client:
                with pytest.raises(TypeError, match=r'signal \'go\' payload\["n"\]: ' + said):
                    await client.signal("c", "go", {"n": long})
                with pytest.raises(TypeError, match=r'data\["n"\]: ' + said):
                    await client.new_case("w", {"n": long}, case_id="d")

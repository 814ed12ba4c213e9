"""An attack on the inputs of a case from every door (the API, a case handle, the store's inbox, `check_input`, the
`wfsub` command): the same bad input gets the same answer, nothing is silently changed, and a refusal says what,
where and the fix.

The first tests pin behaviour that held up; the others pin faults it found, fixed since: an input nested deeper
than `MAX_DEPTH` refused with a message from every door, case data of any depth readable, unknown body fields
refused, `Store.inbox_put` checking its arguments, a cancel reason bounded as a payload is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pydantic
import pytest

from wfsub import CaseFailed, CaseHandle, SignalRejected, Substrate, scope, seq, task, wait
from wfsub._json import MAX_DEPTH
from wfsub.lowlevel import check_input
from wfsub.stores import InboxRow, PostgresStore, SqliteStore, Store, open_store

from .. import _warm
from ..durable._util import eventually
from ..stores import _pg
from ..stores._helpers import STORE_PARAMS, make_store, opened


def _done(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"done": True}


WORKFLOWS = {"w": seq(wait("go"), wait("then"), task(_done))}


def _nested(depth: int) -> Any:
    """A JSON value nested `depth` lists deep (valid JSON, small in bytes)."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


async def _started(sub: Substrate, workflow: Any = "w") -> CaseHandle:
    """A new case, once it waits for its first signal."""
    handle = await sub.new_case(workflow)
    await eventually(lambda: handle.status().signals == ("go",))
    return handle


@asynccontextmanager
async def _durable(tmp_path: Path, **options: Any) -> AsyncIterator[tuple[Substrate, Path]]:
    path = tmp_path / "cases.db"
    async with Substrate(store=SqliteStore(path), workflows=WORKFLOWS, **options) as sub:
        yield sub, path


async def _through_inbox(path: Path, case_id: str, kind: str, body: Mapping[str, Any],
                         request_id: Any = None) -> InboxRow | None:
    """Put an input in the store's inbox as the command does, and follow it until its owner took or refused it."""
    store = open_store(str(path), existing=True)
    await store.open(owner=False, owner_id="attack-writer")
    try:
        inbox_id = await store.inbox_put(case_id, kind, body, request_id=request_id, created_at=0.0)
        with anyio.fail_after(10):
            while True:
                found = await store.inbox_row(inbox_id)
                if found is None or found.refused is not None:
                    return found
                await anyio.sleep(0.01)
    finally:
        await store.close()


# -- what held ---------------------------------------------------------------------------------------------------


async def test_an_oversized_payload_is_refused_alike_by_the_api_a_handle_and_the_inbox(tmp_path: Path) -> None:
    """A payload over max_payload_bytes gets the same refusal from the API, a handle and the inbox."""
    async with _durable(tmp_path, max_payload_bytes=1_000) as (sub, path):
        payload = "x" * 5_000
        answers = []
        for door in ("api", "handle", "inbox"):
            handle = await _started(sub)
            if door == "inbox":
                row = await _through_inbox(path, handle.case_id, "signal", {"name": "go", "payload": payload})
                assert row is not None and row.refused is not None
                answers.append(row.refused)
            else:
                send = sub.signal(handle.case_id, "go", payload) if door == "api" else handle.signal("go", payload)
                with pytest.raises(ValueError, match="max_payload_bytes=1,000") as info:
                    await send
                answers.append(str(info.value))
            assert handle.status().signals == ("go",)
        assert len(set(answers)) == 1 and "5,002 bytes" in answers[0]


# -- faults found, fixed -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("door", ["api", "handle", "check_input", "start_data"])
async def test_a_deeply_nested_payload_is_refused_with_a_message_not_a_recursion_error(
    tmp_path: Path, door: str
) -> None:
    """A payload nested thousands deep is refused with a TypeError/ValueError naming it, not RecursionError."""
    payload = _nested(5_000)
    async with _durable(tmp_path) as (sub, _):
        handle = await _started(sub)
        async def send() -> None:
            if door == "api":
                await sub.signal(handle.case_id, "go", payload)
            elif door == "handle":
                await handle.signal("go", payload)
            elif door == "check_input":
                check_input("signal", {"name": "go", "payload": payload})
            else:
                await sub.new_case("w", {"deep": payload})

        with pytest.raises((TypeError, ValueError), match="payload|data"):
            await send()
        assert handle.status().signals == ("go",)


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "sqlite"])
async def test_a_nested_payload_that_is_accepted_can_be_read_back(tmp_path: Path, durable: bool) -> None:
    """A payload the door accepts comes back from data() and result(): it is refused at the door, or readable."""
    payload = _nested(700)
    options: dict[str, Any] = {"store": SqliteStore(tmp_path / "c.db"), "workflows": WORKFLOWS} if durable else {}
    async with Substrate(**options) as sub:
        handle = await _started(sub, "w" if durable else WORKFLOWS["w"])
        try:
            await handle.signal("go", payload)
        except (TypeError, ValueError):
            return  # refused at the door with a message: nothing to read back
        await handle.signal("then")
        with anyio.fail_after(10):
            result = await handle.result()
        assert result["go"] == payload and handle.data()["go"] == payload


def test_the_command_refuses_a_deeply_nested_payload_with_a_usage_error(tmp_path: Path) -> None:
    """`wfsub signal` with a too deeply nested PAYLOAD is a usage error (status 2), not a traceback."""
    payload = "[" * 20_000 + "]" * 20_000
    done = _warm.command("signal", str(tmp_path / "none.db"), "c1", "go", payload, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    assert done.returncode == 2 and "PAYLOAD" in done.stderr


@pytest.mark.parametrize("door", ["api", "inbox"])
async def test_a_cancel_reason_larger_than_the_payload_limit_is_refused(tmp_path: Path, door: str) -> None:
    """A cancel reason larger than max_payload_bytes is refused naming the limit, as such a payload is."""
    async with _durable(tmp_path, max_payload_bytes=1_000) as (sub, path):
        handle = await _started(sub)
        reason = "r" * 100_000
        if door == "api":
            with pytest.raises(ValueError, match="max_payload_bytes"):
                await sub.cancel(handle.case_id, reason=reason)
        else:
            row = await _through_inbox(path, handle.case_id, "cancel", {"reason": reason})
            assert row is not None and row.refused is not None and "max_payload_bytes" in row.refused
        assert handle.status().signals == ("go",)


# -- the Store's inbox_put, the door of outside writers ---------------------------------------------------------


@asynccontextmanager
async def _outside_writer(kind: str, tmp_path: Path) -> AsyncIterator[Store]:
    store = make_store(kind, tmp_path)
    async with opened(store) as s:
        yield s


@pytest.mark.parametrize("kind", STORE_PARAMS)
@pytest.mark.parametrize(("argument", "value"), [
    ("request_id", 5), ("request_id", 1.5), ("request_id", b"r1"), ("case_id", 5), ("input_kind", 5),
])
async def test_inbox_put_refuses_arguments_of_the_wrong_type(tmp_path: Path, kind: str, argument: str,
                                                             value: Any) -> None:
    """Every backend's inbox_put refuses a non-str request id, case id or kind with a TypeError."""
    given: dict[str, Any] = {"case_id": "c1", "input_kind": "signal", "request_id": None, argument: value}
    async with _outside_writer(kind, tmp_path) as store:
        with pytest.raises(TypeError, match=argument.removeprefix("input_")):
            await store.inbox_put(given["case_id"], given["input_kind"], {"name": "go"},
                                  request_id=given["request_id"], created_at=0.0)
        assert await store.inbox_take() == []


@pytest.mark.parametrize("kind", STORE_PARAMS)
async def test_inbox_put_does_not_silently_turn_int_keys_into_str_keys(tmp_path: Path, kind: str) -> None:
    """A payload with int keys is refused by the inbox as by the API; it is never stored with its keys changed."""
    with pytest.raises(TypeError, match="key 1 is int"):
        check_input("signal", {"name": "go", "payload": {1: "a"}})
    async with _outside_writer(kind, tmp_path) as store:
        with pytest.raises((TypeError, ValueError), match="key"):
            await store.inbox_put("c1", "signal", {"name": "go", "payload": {1: "a"}}, request_id=None,
                                  created_at=0.0)
        assert await store.inbox_take() == []


@pytest.mark.parametrize("kind", STORE_PARAMS)
@pytest.mark.parametrize("body", [[1], [("name", "go")]], ids=["list", "pairs"])
async def test_inbox_put_refuses_a_body_that_is_not_a_mapping_naming_it(tmp_path: Path, kind: str,
                                                                        body: Any) -> None:
    """A body that is not a mapping is refused saying that the body must be a dict of the input's fields."""
    async with _outside_writer(kind, tmp_path) as store:
        with pytest.raises(TypeError, match="body"):
            await store.inbox_put("c1", "signal", body, request_id=None, created_at=0.0)


# -- another node's case (Postgres) ------------------------------------------------------------------------------


class _Typed(pydantic.BaseModel):
    x: int


TYPED = {"w": seq(wait("go"), wait("typed", model=_Typed), scope("review", wait("then")), task(_done))}


@pytest.mark.skipif(not _pg.ENABLED, reason=_pg.SKIP_REASON)
@pytest.mark.parametrize("bad", ["unknown signal", "model refuses", "unknown region"])
async def test_another_nodes_case_refuses_what_its_program_refuses_as_a_local_case_does(bad: str) -> None:
    """What a case's program refuses is refused by another node's call too, as by its owner's."""
    schema = _pg.emptied_schema()

    def store() -> PostgresStore:
        return PostgresStore(_pg.database_dsn(), schema=schema)

    async with Substrate(store=store(), workflows=TYPED, node_id="owner") as owner, \
            Substrate(store=store(), workflows=TYPED, node_id="other") as other:
        handle = await _started(owner)
        send = {
            "unknown signal": lambda sub: sub.signal(handle.case_id, "nope"),
            "model refuses": lambda sub: sub.signal(handle.case_id, "typed", {"x": "not a number"}),
            "unknown region": lambda sub: sub.cancel_region(handle.case_id, "nowhere"),
        }[bad]
        with pytest.raises(SignalRejected):
            await send(owner)  # the owner's own answer
        with pytest.raises(SignalRejected):
            await send(other)


# -- the web inspector's signal form -----------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [600, 5_000])
async def test_the_inspectors_signal_form_refuses_a_deeply_nested_payload_with_a_message(depth: int) -> None:
    """The inspector answers a too deeply nested payload with 400, and a case holding one is shown."""
    pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
    import httpx

    from wfsub.contrib import web
    from wfsub.stores import MemoryStore

    from ..contrib.test_web import csrf_cookie

    async with Substrate(store=MemoryStore(), workflows=WORKFLOWS) as sub:
        handle = await _started(sub)
        transport = httpx.ASGITransport(app=web.app(sub, workflows=WORKFLOWS), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://inspector") as client:
            assert (await client.get("/")).status_code == 200
            form = {"csrf": csrf_cookie(client.cookies)[1], "action": "signal", "name": "go",
                    "payload": "[" * depth + "]" * depth}
            sent = await client.post(f"/case/{handle.case_id}", data=form)
            if sent.status_code == 303:  # taken: the case page shows the case with it
                page = await client.get(sent.headers["location"])
                assert page.status_code == 200, page.status_code
                return
        assert sent.status_code == 400, sent.status_code
        assert handle.status().signals == ("go",)


# -- fields an input does not have -------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "body"), [
    ("cancel", {"reason": "customer asked", "compensat": False}),
    ("signal", {"name": "go", "paylod": {"by": "ann"}}),
], ids=["cancel", "signal"])
async def test_a_field_an_input_does_not_have_is_refused_not_dropped(tmp_path: Path, kind: str,
                                                                     body: dict[str, Any]) -> None:
    """check_input and the inbox refuse a body field its kind does not have instead of dropping it."""
    with pytest.raises((TypeError, ValueError), match=next(iter(set(body) - {"reason", "name", "region"}))):
        check_input(kind, body)
    async with _durable(tmp_path) as (sub, path):
        handle = await _started(sub)
        row = await _through_inbox(path, handle.case_id, kind, body)
        assert row is not None and row.refused is not None
        assert handle.status().signals == ("go",)


def test_an_unknown_field_is_refused_naming_the_fields_the_kind_takes() -> None:
    """The refusal of an unknown body field names it, the input's kind and the fields that kind takes."""
    with pytest.raises(TypeError) as info:
        check_input("cancel", {"reason": "customer asked", "compensat": False})
    assert "a cancel input has no field 'compensat'" in str(info.value)
    assert "its fields are 'reason', 'compensate'" in str(info.value)
    with pytest.raises(TypeError, match="a close_instances input has no field 'item'.*its fields are 'region'"):
        check_input("close_instances", {"region": "r", "item": 1})


# -- the depth limit -------------------------------------------------------------------------------------------


async def test_a_payload_max_depth_deep_is_taken_and_one_level_more_is_refused(tmp_path: Path) -> None:
    """A payload exactly MAX_DEPTH deep is taken and read back; one level deeper is refused saying what, where, fix."""
    async with _durable(tmp_path) as (sub, _):
        handle = await _started(sub)
        with pytest.raises(ValueError) as info:
            await handle.signal("go", {"tree": _nested(MAX_DEPTH)})
        message = str(info.value)
        assert f"the payload of signal 'go': nested deeper than {MAX_DEPTH} levels" in message
        assert repr(handle.case_id) in message and "flatten it" in message
        await handle.signal("go", _nested(MAX_DEPTH))
        await handle.signal("then")
        with anyio.fail_after(10):
            result = await handle.result()
        assert result["go"] == _nested(MAX_DEPTH)


async def test_a_task_output_deeper_than_any_input_is_readable_in_memory_and_refused_by_a_durable_case(
    tmp_path: Path,
) -> None:
    """A case in memory may hold data of any depth and hands it out; a durable case fails the task with a message."""

    def deep(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {"deep": _nested(5_000)}

    async with Substrate() as sub:
        handle = await sub.new_case(seq(task(deep)))
        with anyio.fail_after(10):
            result = await handle.result()
        assert type(result["deep"]) is list and type(handle.data()["deep"]) is list
        assert result["deep"] is not handle.data()["deep"]  # (a copy each time)
    async with Substrate(store=SqliteStore(tmp_path / "c.db"), workflows={"deep": seq(task(deep))}) as sub:
        handle = await sub.new_case("deep")
        with anyio.fail_after(10), pytest.raises(CaseFailed, match=f"nested deeper than {MAX_DEPTH} levels"):
            await handle.result()


@pytest.mark.parametrize("kind", STORE_PARAMS)
async def test_inbox_put_refuses_a_body_nested_too_deep_to_encode(tmp_path: Path, kind: str) -> None:
    """A body nested deeper than JSON encoders follow is refused by inbox_put with a message, not RecursionError."""
    async with _outside_writer(kind, tmp_path) as store:
        with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH} levels"):
            await store.inbox_put("c1", "signal", {"name": "go", "payload": _nested(5_000)}, request_id=None,
                                  created_at=0.0)
        assert await store.inbox_take() == []

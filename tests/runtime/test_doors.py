"""The same inputs, good and bad, through every door that takes them (the Substrate, a CaseHandle, a Client, the
`wfsub` command, the web form), without a store and on SQLite: each door refuses a bad one with the same error
type and message (the command and the web form say the message in their own words around it), and takes a good
one."""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from click.testing import CliRunner

from wfsub import Client, Substrate, scope, seq, wait
from wfsub.cli import main as command

pytest.importorskip("starlette", reason="the web extra (starlette) is not installed")
pytest.importorskip("jinja2", reason="the web extra (jinja2) is not installed")

from wfsub.contrib import web  # noqa: E402

LIMIT = 4096  # max_payload_bytes of every door: a reason longer than this is refused
W = {"w": seq(wait("go"), scope("R", wait("b", reply=lambda ctx: "ok")), wait("end"))}

UNSUPPORTED = ("unsupported", "")  # a door that has no way to send that input
Door = Callable[[str, str, dict[str, Any]], Awaitable[tuple[str, str] | None]]  # (case id, kind, args) -> refusal

# what is sent: (its kind, the arguments of the door's method for that kind)
BAD: dict[str, tuple[str, dict[str, Any]]] = {
    "unknown name": ("signal", {"name": "nosuch"}),
    "bad request id": ("signal", {"name": "go", "request_id": "a\x00b"}),
    "too deep payload": ("signal", {"name": "go", "payload": "DEEP"}),
    "unknown update": ("update", {"name": "nosuch"}),
    "blank reason": ("cancel", {"reason": "   "}),
    "oversized reason": ("cancel", {"reason": "x" * (LIMIT + 1)}),
    "unknown region": ("cancel_region", {"region": "nosuch"}),
}


def _deep() -> Any:
    value: Any = 1
    for _ in range(300):
        value = [value]
    return value


def _payload(given: Any) -> Any:
    return _deep() if given == "DEEP" else given


async def _refusal(call: Awaitable[Any]) -> tuple[str, str] | None:
    try:
        await call
    except Exception as exc:  # noqa: BLE001 - the refusal is what is compared
        return type(exc).__name__, str(exc)
    return None


def _substrate_door(sub: Substrate) -> Door:
    async def send(case_id: str, kind: str, args: dict[str, Any]) -> tuple[str, str] | None:
        rid = args.get("request_id")
        if kind == "signal":
            return await _refusal(sub.signal(case_id, args["name"], _payload(args.get("payload")), request_id=rid))
        if kind == "update":
            return await _refusal(sub.update(case_id, args["name"], None, request_id=rid, timeout=5))
        if kind == "cancel":
            return await _refusal(sub.cancel(case_id, reason=args["reason"], request_id=rid))
        return await _refusal(sub.cancel_region(case_id, args["region"], request_id=rid))

    return send


def _handle_door(sub: Substrate) -> Door:
    async def send(case_id: str, kind: str, args: dict[str, Any]) -> tuple[str, str] | None:
        try:
            handle = sub.handle(case_id)
        except Exception as exc:  # noqa: BLE001 - an unknown case is refused where its handle is asked for
            return type(exc).__name__, str(exc)
        rid = args.get("request_id")
        if kind == "signal":
            return await _refusal(handle.signal(args["name"], _payload(args.get("payload")), request_id=rid))
        if kind == "update":
            return await _refusal(handle.update(args["name"], None, request_id=rid, timeout=5))
        if kind == "cancel":
            return await _refusal(handle.cancel(reason=args["reason"]))
        return UNSUPPORTED  # (a handle has no cancel_region)

    return send


def _client_door(client: Client) -> Door:
    async def send(case_id: str, kind: str, args: dict[str, Any]) -> tuple[str, str] | None:
        rid = args.get("request_id")
        if kind == "signal":
            return await _refusal(client.signal(case_id, args["name"], _payload(args.get("payload")), request_id=rid))
        if kind == "update":
            return await _refusal(client.update(case_id, args["name"], None, request_id=rid, timeout=5))
        if kind == "cancel":
            return await _refusal(client.cancel(case_id, reason=args["reason"], request_id=rid))
        return await _refusal(client.cancel_region(case_id, args["region"], request_id=rid))

    return send


def _web_door(http: httpx.AsyncClient, csrf: str) -> Door:
    async def send(case_id: str, kind: str, args: dict[str, Any]) -> tuple[str, str] | None:
        if kind not in ("signal", "update", "cancel") or args.get("payload") == "DEEP":
            return UNSUPPORTED  # (the form sends JSON text: its own reader refuses a payload too deep to read)
        form = {"csrf": csrf, "action": kind, "request_id": args.get("request_id") or ""}
        if kind == "cancel":
            form["reason"] = args["reason"]
        else:
            form["name"] = args["name"]
        page = await http.post(f"/case/{case_id}", data=form)
        if page.status_code in (200, 202, 303):
            return None
        found = re.search(r'id="message"[^>]*>(.*?)</p>', page.text, re.S)
        assert found, page.text[:2000]
        return "refused", html.unescape(found.group(1)).strip()

    return send


def _command_door(db: Path) -> Door:
    async def send(case_id: str, kind: str, args: dict[str, Any]) -> tuple[str, str] | None:
        if kind == "update" or args.get("payload") == "DEEP":
            return UNSUPPORTED  # (the command sends an update as a Client does, and reads a payload as JSON text)
        rid = args.get("request_id")
        given = [*(["--request-id", rid] if rid is not None else []), "--timeout", "10"]
        if kind == "signal":
            argv = ["signal", str(db), case_id, args["name"], *given]
        elif kind == "cancel":
            argv = ["cancel", str(db), case_id, "--reason", args["reason"], *given]
        else:
            argv = ["cancel", str(db), case_id, "--region", args["region"], *given]
        ran = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(command, argv, env={"COLUMNS": "2000"}))
        if ran.exit_code == 0:
            return None
        return "command", ran.output.strip()

    return send


@asynccontextmanager
async def _doors(tmp_path: Path, durable: bool) -> AsyncIterator[tuple[Substrate, dict[str, Any]]]:
    store = tmp_path / "cases.db" if durable else None
    async with Substrate(store=store, workflows=W, max_payload_bytes=LIMIT) as sub:
        asgi = web.app(sub, workflows=W)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi), base_url="http://inspector") as http:
            await http.get("/")
            csrf = next(c.value for c in http.cookies.jar if c.name.startswith(web._app.CSRF_COOKIE))
            doors: dict[str, Any] = {"substrate": _substrate_door(sub), "handle": _handle_door(sub),
                                     "web": _web_door(http, csrf or "")}
            if not durable:
                yield sub, doors
                return
            async with Client(store, max_payload_bytes=LIMIT) as client:
                doors["client"] = _client_door(client)
                doors["command"] = _command_door(store)
                yield sub, doors


async def _waiting(sub: Substrate, case_id: str, signals: tuple[str, ...]) -> None:
    with anyio.fail_after(10):
        while sub.status(case_id).signals != signals:  # noqa: ASYNC110 - the public status is what is waited on
            await anyio.sleep(0.005)


def _same(said: dict[str, tuple[str, str] | None], *, command_fix: bool = False) -> None:
    """Every door refused, with one type and message: the API's doors alike; the web form shows that message, and
    the command says it within its own words (`command_fix`: with its own fix, a command to run, after the
    message's first clause)."""
    assert all(refusal is not None for refusal in said.values()), said
    api = {door: refusal for door, refusal in said.items() if refusal is not None and door not in ("web", "command")}
    assert len(set(api.values())) == 1, api
    kind, text = api["substrate"]
    if said.get("web") is not None:
        assert said["web"] == ("refused", text), said["web"]
    if said.get("command") is not None:
        assert (text.split(":")[0] if command_fix else text) in said["command"][1], (text, said["command"])


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "sqlite"])
@pytest.mark.parametrize("case", list(BAD))
async def test_a_bad_input_is_refused_alike_by_every_door(tmp_path: Path, durable: bool, case: str) -> None:
    """A bad input to a live case gets the same refusal from each door, and the case is unchanged."""
    kind, args = BAD[case]
    if case == "oversized reason" and not durable:
        pytest.skip("max_payload_bytes bounds what a store keeps: a Substrate without one keeps any reason")
    async with _doors(tmp_path, durable) as (sub, doors):
        await sub.new_case("w", {}, case_id="c")
        await _waiting(sub, "c", ("go",))
        said = {door: await send("c", kind, args) for door, send in doors.items()}
        said = {door: refusal for door, refusal in said.items() if refusal != UNSUPPORTED}
        _same(said)
        assert sub.status("c").signals == ("go",)


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "sqlite"])
@pytest.mark.parametrize("kind", ["signal", "cancel"])
async def test_an_input_to_an_unknown_or_ended_case_is_refused_alike_by_every_door(
    tmp_path: Path, durable: bool, kind: str
) -> None:
    """An input to a case that does not exist, or has ended, gets the same refusal from each door."""
    args = {"name": "go"} if kind == "signal" else {"reason": "done with it"}
    async with _doors(tmp_path, durable) as (sub, doors):
        unknown = {door: await send("nope", kind, args) for door, send in doors.items() if door != "web"}
        _same(unknown, command_fix=True)
        handle = await sub.new_case("w", {}, case_id="ended")
        await handle.cancel(reason="ended first")
        with pytest.raises(Exception):  # noqa: B017, PT011 - the case's own outcome
            await handle.result()
        ended = {door: await send("ended", kind, args) for door, send in doors.items()}
        _same(ended)


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "sqlite"])
async def test_a_good_input_is_taken_by_every_door(tmp_path: Path, durable: bool) -> None:
    """A good signal, update and cancel are taken through each door (one case per door)."""
    async with _doors(tmp_path, durable) as (sub, doors):
        for door, send in doors.items():
            case_id = f"c-{door}"
            await sub.new_case("w", {}, case_id=case_id)
            await _waiting(sub, case_id, ("go",))
            assert await send(case_id, "signal", {"name": "go", "request_id": f"{door}-go"}) is None, door
            await _waiting(sub, case_id, ("b",))
            if await send(case_id, "update", {"name": "b"}) == UNSUPPORTED:
                assert await sub.update(case_id, "b") == "ok"
            await _waiting(sub, case_id, ("end",))
            assert await send(case_id, "cancel", {"reason": f"through {door}"}) is None, door
            with anyio.fail_after(10):
                while sub.status(case_id).state != "cancelled":  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            assert sub.status(case_id).cancel_reason == f"through {door}"

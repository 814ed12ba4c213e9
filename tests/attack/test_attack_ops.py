"""Attacks on wfsub's operating surface: status and data, logging, the `wfsub` command, diagrams, typed edges,
OpenTelemetry and the FastAPI example, through the public API and the command only.

Each `xfail(strict=True)` test is a fault found here: it fails on the code as it is and says, in its reason, what
is wrong. The other tests pin behaviour that was checked and found right, where no other test pins it.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import anyio
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from wfsub import (
    CaseFailed,
    CaseHandle,
    Retry,
    SignalRejected,
    Substrate,
    call,
    effect,
    mi,
    net,
    par,
    saga,
    scope,
    seq,
    sleep,
    task,
    to_dot,
    to_mermaid,
    wait,
)
from wfsub.contrib.otel import OTelSink
from wfsub.stores import MemoryStore
from wfsub.testing import VirtualClock

from .. import _warm
from ..contrib.test_diagram import parse_dot

# -- workflows and helpers ----------------------------------------------------------------------------------------

CARD = "4111-1111-1111-1111"


def _count(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": len(ctx["items"])}


def _decline(ctx: Mapping[str, Any]) -> None:
    raise ValueError(f"card {ctx['card']} declined")


def _ok(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"ok": True}


def _boom(ctx: Mapping[str, Any]) -> None:
    raise RuntimeError("boom")


def _noop(ctx: Mapping[str, Any]) -> None:
    return None


async def _down(ctx: Mapping[str, Any]) -> None:
    raise ConnectionError("down")


def _redact(value: Any) -> Any:
    """What an app passes as redact=: the card number never reaches what people read."""
    if isinstance(value, str):
        return value.replace(CARD, "****")
    if isinstance(value, Mapping):
        return {k: _redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(v) for v in value]
    return value


class Approval(BaseModel):
    by: str
    amount: int


class Start(BaseModel):
    order: int
    when: datetime


class Final(BaseModel):
    order: int
    ok: bool


COUNT = seq(wait("go"), task(_count, name="count"))
DECLINE = seq(task(_decline, name="check"))
PARKED = seq(task(_ok, name="first"), par(wait("go"), sleep(60)))
BAD = seq(task(_boom, name="boom"))
TYPED = seq(wait("approve", model=Approval), task(_ok, name="ok"))
TWO_WAITS = seq(wait("go"), wait("go2"))
INNER = seq(task(_noop, name="inner"), wait("go"))
OUTER = seq(call("inner"), task(_ok, name="after"))


async def settled(handle: CaseHandle, state: str, timeout: float = 5) -> None:  # noqa: ASYNC109
    """Wait (real time) until the case is in `state`."""
    with anyio.fail_after(timeout):
        while handle.status().state != state:  # noqa: ASYNC110 - polling the public status
            await anyio.sleep(0.01)


# -- sub.data, sub.cases, CaseHandle.done, await_case(timeout=0), CaseStatus ----------------------------------------


async def test_data_is_a_copy_that_cannot_change_the_live_case(tmp_path: Path) -> None:
    """What data() returned is the caller's to modify: the running case goes on with its own data."""
    async with Substrate(store=tmp_path / "d.db", workflows={"count": COUNT}) as sub:
        handle = await sub.new_case("count", {"items": [1, 2], "meta": {"k": "v"}})
        await settled(handle, "waiting_signal")
        sub.data(handle.case_id)["items"].append(99)
        handle.data()["meta"]["k"] = "changed"
        assert sub.data(handle.case_id) == {"items": [1, 2], "meta": {"k": "v"}}
        await handle.signal("go")
        assert (await handle.result())["n"] == 2


async def test_cases_filtered_by_state_list_the_cases_in_that_state_with_a_store(tmp_path: Path) -> None:
    """cases(state=S) lists exactly the cases whose status says S."""
    gate = anyio.Event()

    async def hold(ctx: Mapping[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return {"held": True}

    held = seq(effect(hold, name="hold"), wait("go"))
    async with Substrate(store=tmp_path / "c.db", workflows={"held": held}) as sub:
        handle = await sub.new_case("held", case_id="h1")
        try:
            await settled(handle, "waiting_effect")
            assert [s.case_id for s in sub.cases(state="waiting_effect")] == ["h1"]
            assert [(s.case_id, s.state.value) for s in sub.cases(state="running")] == []
        finally:
            gate.set()


async def test_cases_can_be_paged_with_before_through_the_public_api(tmp_path: Path) -> None:
    """The cursor that before= takes is reachable from the page just read."""
    async with Substrate(store=tmp_path / "p.db", workflows={"parked": PARKED}) as sub:
        for i in range(5):
            await sub.new_case("parked", case_id=f"c{i}")
        page = sub.cases(limit=2)
        assert [s.case_id for s in page] == ["c4", "c3"]
        cursor = getattr(page[-1], "order", None)
        if cursor is None:
            cursor = sub.case_order(page[-1].case_id)  # type: ignore[attr-defined]  # as the docstring says
        assert [s.case_id for s in sub.cases(limit=10, before=cursor)] == ["c2", "c1", "c0"]


async def test_cases_before_is_not_silently_ignored_without_a_store() -> None:
    """Paging code written for a durable Substrate does not loop forever on one without a store."""
    async with Substrate() as sub:
        for i in range(3):
            await sub.new_case(TWO_WAITS, case_id=f"c{i}")
        everything = sub.cases()
        try:
            page = sub.cases(before=1)
        except (TypeError, ValueError):
            return  # refused, saying why: fine
        assert page != everything


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_a_before_that_is_not_a_cursor_is_refused_naming_before(tmp_path: Path, kind: str) -> None:
    """cases(before='x') is refused with a message naming `before`, as the other arguments are."""
    store: Any = tmp_path / "b.db" if kind == "sqlite" else MemoryStore()
    async with Substrate(store=store, workflows={"parked": PARKED}) as sub:
        await sub.new_case("parked")
        with pytest.raises((TypeError, ValueError), match="before"):
            sub.cases(before="x")  # type: ignore[arg-type]


async def test_done_stays_false_for_a_durable_case_left_live_when_the_substrate_closed(tmp_path: Path) -> None:
    """done() says whether the case has ended; closing the Substrate does not end a durable case."""
    async with Substrate(store=tmp_path / "d.db", workflows={"two": TWO_WAITS}) as sub:
        handle = await sub.new_case("two", case_id="c1")
        await settled(handle, "waiting_signal")
    assert handle.status().state == "waiting_signal"
    assert not handle.done()


async def test_await_case_timeout_zero_never_waits() -> None:
    """timeout=0 answers at once: the outcome, or TimeoutError; it never waits for stubborn effects."""
    release = anyio.Event()

    async def stubborn(ctx: Mapping[str, Any]) -> None:
        with anyio.CancelScope(shield=True):
            await release.wait()

    flow = par(effect(stubborn, name="stubborn"), seq(wait("go"), task(_boom, name="boom")))
    async with Substrate(shutdown_timeout=0.5) as sub:
        try:
            handle = await sub.new_case(flow)
            await settled(handle, "waiting_effect")
            await handle.signal("go")
            await settled(handle, "failed")
            with anyio.move_on_after(1) as waited:
                with pytest.raises((CaseFailed, TimeoutError)):
                    await sub.await_case(handle.case_id, timeout=0)
            assert not waited.cancelled_caught, "await_case(timeout=0) was still waiting after 1 s"
        finally:
            release.set()  # else leaving the Substrate waits for the stubborn effect for ever


async def test_an_effect_waiting_out_its_retry_backoff_claims_no_start_in_the_future() -> None:
    """EffectStatus.started_at is when the attempt started: never later than now."""
    clock = VirtualClock()
    flaky = seq(effect(_down, name="flaky", retry=Retry(max_attempts=3, initial=10, max_interval=10)))
    async with Substrate(clock=clock) as sub:
        handle = await sub.new_case(flaky)
        await clock.advance(1)
        [running] = handle.status().effects
        assert running.started_at is None or running.started_at <= clock.now(), (running, clock.now())
        await handle.cancel(compensate=False)


async def test_status_data_and_cases_report_the_same_case_in_memory_and_after_a_restart(tmp_path: Path) -> None:
    """at, signals, timers with due times, workflow, times, failure and the newest-first list survive a restart."""
    db = tmp_path / "s.db"
    workflows = {"parked": PARKED, "bad": BAD}
    async with Substrate(store=db, workflows=workflows) as sub:
        parked = await sub.new_case("parked", {"x": 1}, case_id="p1")
        bad = await sub.new_case("bad", {"y": 2}, case_id="b1")
        await settled(parked, "waiting_signal")
        with pytest.raises(CaseFailed):
            await bad.result()
        live, failed = sub.status("p1"), sub.status("b1")
        assert set(live.at) == {"seq[1].par[0].wait", "seq[1].par[1].sleep"}
        assert live.signals == ("go",) and live.workflow == "parked" and live.ended_at is None
        assert [(t.path, t.due) for t in live.timers] == [("seq[1].par[1].sleep", live.started_at + 60)]
        assert failed.failure is not None
        assert (failed.failure.type, failed.failure.path) == ("RuntimeError", "seq[0].task")
        assert "boom" in failed.failure.message and failed.ended_at is not None
        assert sub.data("p1") == {"x": 1, "ok": True} and not parked.done() and bad.done()
    async with Substrate(store=db, workflows=workflows) as sub:
        assert [s.case_id for s in sub.cases()] == ["b1", "p1"]
        assert [s.case_id for s in sub.cases(state="failed", workflow="bad", limit=1)] == ["b1"]
        again = sub.status("p1")
        for field in ("state", "at", "signals", "timers", "workflow", "started_at", "ended_at"):
            assert getattr(again, field) == getattr(live, field), field
        assert sub.status("b1").failure is not None and sub.status("b1").failure == failed.failure
        assert sub.data("p1") == {"x": 1, "ok": True}
        with pytest.raises(TimeoutError):
            await sub.await_case("p1", timeout=0)
        with pytest.raises(CaseFailed, match="boom"):
            await sub.await_case("b1", timeout=0)


# -- typed edges ----------------------------------------------------------------------------------------------------


async def test_typed_edges_validate_start_data_payloads_and_final_data(tmp_path: Path) -> None:
    """Models type start data, wait payloads (a mismatch is refused, unrecorded) and final data (named on mismatch)."""
    # A model as start data is dumped as JSON; result(model=) and await_case(model=) validate the final data.
    async with Substrate(store=tmp_path / "t.db", workflows={"typed": TYPED}) as sub:
        handle = await sub.new_case("typed", Start(order=1, when=datetime(2024, 1, 2, 3, 4, 5)))
        await settled(handle, "waiting_signal")
        assert handle.data() == {"order": 1, "when": "2024-01-02T03:04:05"}
        journal = [r.model_dump() for r in await sub.journal(handle.case_id)]
        with pytest.raises(SignalRejected) as refused:
            await handle.signal("approve", {"by": 5})
        assert {tuple(e["loc"]) for e in refused.value.errors} == {("by",), ("amount",)}  # type: ignore[arg-type]
        assert "Approval" in str(refused.value)
        assert [r.model_dump() for r in await sub.journal(handle.case_id)] == journal
        assert handle.status().state == "waiting_signal" and "approve" not in handle.data()

        await handle.signal("approve", Approval(by="ann", amount=3))
        final = await handle.result(model=Final)
        assert final == Final(order=1, ok=True)
        assert await sub.await_case(handle.case_id, model=Final) == final
        with pytest.raises(ValueError, match="does not fit Approval"):
            await handle.result(model=Approval)
        with pytest.raises(TypeError, match="pydantic model class"):
            await handle.result(model=dict)  # type: ignore[arg-type]


# -- logging ---------------------------------------------------------------------------------------------------------


def test_an_app_that_uses_only_logging_gets_plain_messages(tmp_path: Path) -> None:
    """An app with logging.basicConfig gets wfsub's records as plain text its own format decorates."""
    script = textwrap.dedent(
        """
        import anyio, logging, sys
        logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s|%(levelname)s|%(message)s")
        from wfsub import CaseFailed, Substrate, task

        def boom(ctx):
            raise RuntimeError("boom")

        async def main():
            async with Substrate() as sub:
                handle = await sub.new_case(task(boom, name="boom"))
                try:
                    await handle.result()
                except CaseFailed:
                    pass

        anyio.run(main)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path,
                          env={**os.environ, "FORCE_COLOR": "1"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("wfsub.")]
    assert lines, done.stdout + done.stderr
    for line in lines:
        _name, _level, message = line.split("|", 2)
        assert "\x1b[" not in message and "[info" not in message, message


def test_a_durable_substrate_with_failing_cases_prints_nothing_by_default(tmp_path: Path) -> None:
    """With a store, failing effects (after retries), a failing compensation and live cases at close: silent."""
    script = textwrap.dedent(
        """
        import anyio
        from wfsub import CaseFailed, CompensationFailed, Retry, Substrate, effect, saga, seq, task, wait

        async def down(ctx):
            raise ConnectionError("down")

        def boom(ctx):
            raise RuntimeError("boom")

        flows = {
            "effect": seq(effect(down, name="down", retry=Retry(max_attempts=2, initial=0.01))),
            "task": seq(task(boom, name="boom")),
            "saga": saga((task(lambda c: {"a": 1}, name="a"), effect(down, name="undo")), task(boom, name="b")),
            "parked": seq(wait("never")),
        }

        async def main():
            async with Substrate(store="quiet.db", workflows=flows) as sub:
                for name in ("effect", "task", "saga"):
                    try:
                        await (await sub.new_case(name)).result()
                    except (CaseFailed, CompensationFailed):
                        pass
                await sub.new_case("parked")
            async with Substrate(store="quiet.db", workflows=flows) as sub:
                sub.cases()

        anyio.run(main)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert (done.stdout, done.stderr) == ("", "")


async def test_redact_keeps_secrets_out_of_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    """A Substrate given redact= logs a failed case without the secret."""
    caplog.set_level(logging.INFO, logger="wfsub")
    async with Substrate(redact=_redact) as sub:
        handle = await sub.new_case(DECLINE, {"card": CARD})
        with pytest.raises(CaseFailed):
            await handle.result()
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("wfsub")]
    assert any("case failed" in m for m in messages)
    assert not any(CARD in m for m in messages), messages


async def test_redact_keeps_secrets_out_of_the_status_of_a_failed_case() -> None:
    """status() of a failed case, as people read it, has been through redact=."""
    async with Substrate(redact=_redact) as sub:
        handle = await sub.new_case(DECLINE, {"card": CARD})
        with pytest.raises(CaseFailed):
            await handle.result()
        status = handle.status()
    assert status.failure is not None
    assert CARD not in status.failure.message
    assert CARD not in (status.failure.traceback or "")
    assert CARD not in (status.error or "")


def test_an_app_that_configures_structlog_sees_wfsubs_events_beside_its_own(tmp_path: Path) -> None:
    """With structlog configured at INFO and printing JSON, wfsub's 'case failed' appears where the app's own do."""
    script = textwrap.dedent(
        """
        import anyio, logging, sys, structlog
        structlog.configure(
            processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
            logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        )
        from wfsub import CaseFailed, Substrate, task

        def boom(ctx):
            raise RuntimeError("boom")

        async def main():
            structlog.get_logger("app").info("app started")
            async with Substrate() as sub:
                handle = await sub.new_case(task(boom, name="boom"))
                try:
                    await handle.result()
                except CaseFailed:
                    pass

        anyio.run(main)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert '"event": "app started"' in done.stdout
    assert '"event": "case failed"' in done.stdout, (done.stdout, done.stderr)


# -- the wfsub command -----------------------------------------------------------------------------------------------

FLOWS = '''
from pydantic import BaseModel
from wfsub import effect, loop, saga, seq, task, wait


class Approval(BaseModel):
    by: str
    amount: int


def reserve(d):
    return {"reserved": True}


def undo(d):
    return {"undone": True}


async def charge(d):
    return {"charged": d.get("amount", 0)}


order = seq(task(reserve), wait("approve"), effect(charge, name="charge"))
typed = seq(task(reserve), wait("approve", model=Approval))
sag = saga((task(reserve), task(undo)), wait("approve"))
ticker = seq(loop(wait("tick"), times=3), wait("never"))
WORKFLOWS = {"order": order, "typed": typed, "saga": sag, "ticker": ticker}
ORDERS_ONLY = {"order": order}
'''

TIMED_V1 = '''
from wfsub import seq, sleep, task, wait


def first(d):
    return {"first": True}


flow = seq(task(first), sleep(3600), wait("go"))
W = {"flow": flow}
'''
# The next version waits first and sleeps after: a case parked on v1's timer has no such timer on v2.
TIMED_V2 = TIMED_V1.replace('seq(task(first), sleep(3600), wait("go"))', 'seq(task(first), wait("go"), sleep(3600))')

MODULES = {"atkflows": FLOWS, "atktimed_v1": TIMED_V1, "atktimed_v2": TIMED_V2}
UUID_ID = "order-3fa85f64-5717-4562-b3fc-2c963f66afa6"


class Ran(NamedTuple):
    code: int
    out: str
    err: str


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    """A directory holding the workflow modules, importable by the test as by the command."""
    for name, text in MODULES.items():
        (tmp_path / f"{name}.py").write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in MODULES:
            sys.modules.pop(name, None)


def module(name: str) -> ModuleType:
    return importlib.import_module(name)


async def wfsub(here: Path, *args: str, env: dict[str, str] | None = None) -> Ran:
    """Run `python -m wfsub ARGS` in `here` without blocking the Substrate running in this event loop."""
    proc = await _warm.acommand(*args, cwd=here, env={**os.environ, "COLUMNS": "200", **(env or {})})
    return Ran(proc.returncode, proc.stdout, proc.stderr)


@asynccontextmanager
async def owner(here: Path, **options: Any) -> AsyncIterator[Substrate]:
    async with Substrate(store=here / "cases.db", workflows=module("atkflows").WORKFLOWS, **options) as sub:
        yield sub


async def test_the_cases_table_keeps_whole_case_ids_and_states_at_80_columns(here: Path) -> None:
    """The id a person copies out of `wfsub cases` is the whole id, and the state is readable."""
    async with owner(here) as sub:
        long = await sub.new_case("order", {"amount": 1}, case_id=UUID_ID)
        short = await sub.new_case("order", {"amount": 2}, case_id="o2")
        await settled(long, "waiting_signal")
        await settled(short, "waiting_signal")
        ran = await wfsub(here, "cases", "cases.db", env={"COLUMNS": "80"})
    assert ran.code == 0, ran.err
    assert UUID_ID in ran.out
    assert ran.out.count("waiting_signal") == 2 and ran.out.count("signal approve") == 2


async def test_odd_case_ids_work_through_the_store_commands(here: Path) -> None:
    """Ids with spaces, unicode, 300 characters or a leading dash (after --) are shown, read and signalled."""
    odd = ["with space", "ünïcødé-订单", "x" * 300, "-dash"]
    async with owner(here) as sub:
        handles = [await sub.new_case("order", {"amount": i}, case_id=case_id) for i, case_id in enumerate(odd)]
        for handle in handles:
            await settled(handle, "waiting_signal")
        for i, case_id in enumerate(odd):
            ran = await wfsub(here, "show", "cases.db", "--json", "--", case_id)
            assert ran.code == 0, (case_id, ran.err)
            assert '"case_id": ' in ran.out and case_id in ran.out
            ran = await wfsub(here, "data", "cases.db", "--", case_id)
            assert ran.code == 0 and f'"amount": {i}' in ran.out
        ran = await wfsub(here, "signal", "cases.db", "--", "ünïcødé-订单", "approve", '"ok"')
        assert ran.code == 0, ran.err
        assert (await handles[1].result())["approve"] == "ok"


async def test_a_signal_from_the_command_reaches_the_running_owner_within_a_fraction_of_a_second(here: Path) -> None:
    """signal --no-wait returns at once; the owner notices the inbox row and applies it well within a second."""
    async with owner(here) as sub:
        handle = await sub.new_case("order", {"amount": 1}, case_id="fast")
        await settled(handle, "waiting_signal")
        ran = await wfsub(here, "signal", "cases.db", "fast", "approve", '"quick"', "--no-wait")
        assert ran.code == 0 and "sent:" in ran.err
        started = time.monotonic()
        with anyio.fail_after(5):
            await handle.result()
        assert time.monotonic() - started < 1.0


async def test_concurrent_commands_with_one_request_id_apply_the_signal_once(here: Path) -> None:
    """Three commands racing with the same --request-id: one signal record, every command exits 0."""
    codes: list[int] = []

    async def send(payload: str) -> None:
        codes.append((await wfsub(here, "signal", "cases.db", "k", "tick", payload, "--request-id", "once")).code)

    async with owner(here) as sub:
        handle = await sub.new_case("ticker", case_id="k")
        await settled(handle, "waiting_signal")
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(send, str(i))
        assert codes == [0, 0, 0]
        assert [r.kind for r in await sub.journal("k")] == ["start", "signal"]


async def test_a_payload_off_its_model_is_refused_by_the_command_and_nothing_is_recorded(here: Path) -> None:
    """`wfsub signal` with a payload its wait's model rejects exits 1 with pydantic's errors; the case is unchanged."""
    async with owner(here) as sub:
        handle = await sub.new_case("typed", case_id="t")
        await settled(handle, "waiting_signal")
        journal = [r.model_dump() for r in await sub.journal("t")]
        ran = await wfsub(here, "signal", "cases.db", "t", "approve", '{"by": 5}')
        assert ran.code == 1
        assert "cannot take signal 'approve'" in ran.err and "Approval" in ran.err and "amount" in ran.err
        assert "nothing was sent" in ran.err
        assert [r.model_dump() for r in await sub.journal("t")] == journal
        assert handle.status().state == "waiting_signal" and "approve" not in handle.data()
        ran = await wfsub(here, "signal", "cases.db", "t", "approve", '{"by": "ann", "amount": 3}')
        assert ran.code == 0, ran.err
        assert (await handle.result())["approve"] == {"by": "ann", "amount": 3}


async def test_a_payload_over_max_payload_bytes_is_refused_by_the_command(here: Path) -> None:
    """The owner's max_payload_bytes holds for inputs from the command too: exit 1 naming it, nothing recorded."""
    async with owner(here, max_payload_bytes=1000) as sub:
        handle = await sub.new_case("order", {"amount": 1}, case_id="big")
        await settled(handle, "waiting_signal")
        journal = [r.model_dump() for r in await sub.journal("big")]
        ran = await wfsub(here, "signal", "cases.db", "big", "approve", '"' + "y" * 5000 + '"')
        assert ran.code == 1 and "max_payload_bytes" in ran.err
        assert [r.model_dump() for r in await sub.journal("big")] == journal
        assert handle.status().state == "waiting_signal"


async def test_show_lists_the_effect_a_case_is_waiting_on(here: Path) -> None:
    """An operator sees which effect a case waits on, where, and since when, while the owner runs."""
    gate = anyio.Event()

    async def quick(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {"quick": True}

    async def held(ctx: Mapping[str, Any]) -> dict[str, Any]:
        await gate.wait()
        return {"held": True}

    chain = seq(effect(quick, name="quick"), effect(held, name="held"))
    async with Substrate(store=here / "fx.db", workflows={"chain": chain}) as sub:
        try:
            handle = await sub.new_case("chain", case_id="c1")
            await settled(handle, "waiting_effect")
            await anyio.sleep(0.3)
            assert [e.name for e in handle.status().effects] == ["held"]
            ran = await wfsub(here, "show", "fx.db", "c1", "--json")
        finally:
            gate.set()
    assert ran.code == 0, ran.err
    shown = json.loads(ran.out)
    assert shown["state"] == "waiting_effect"
    assert [(e["name"], e["path"]) for e in shown["effects"]] == [("held", "seq[1].effect")]


async def test_a_signal_sent_while_the_owner_closes_is_applied_by_the_next_owner(here: Path) -> None:
    """A signal sent while the owner closes stays in the inbox (the command exits 1); the next owner applies it."""
    # The owner is held up closing by an effect that ignores cancellation.
    release = anyio.Event()

    async def stubborn(ctx: Mapping[str, Any]) -> None:
        with anyio.CancelScope(shield=True):
            await release.wait()

    workflows = {"stub": seq(effect(stubborn, name="stubborn")), "two": TWO_WAITS}
    ran: Ran | None = None

    async def send_then_release() -> None:
        nonlocal ran
        await anyio.sleep(0.2)  # the owner is closing by now
        try:
            ran = await wfsub(here, "signal", "closing.db", "b", "go", '"late"', "--timeout", "1")
        finally:
            release.set()

    closing = Substrate(store=here / "closing.db", workflows=workflows, shutdown_timeout=10)
    async with anyio.create_task_group() as tg, closing as sub:  # the command runs on while the owner closes
        await settled(await sub.new_case("stub", case_id="a"), "waiting_effect")
        await settled(await sub.new_case("two", case_id="b"), "waiting_signal")
        tg.start_soon(send_then_release)
    assert ran is not None
    assert ran.code == 1 and "stays in the inbox" in ran.err
    async with Substrate(store=here / "closing.db", workflows=workflows) as sub:
        with anyio.fail_after(5):
            while sub.status("b").signals != ("go2",):  # noqa: ASYNC110
                await anyio.sleep(0.02)
        assert sub.data("b") == {"go": "late"}
        if not sub.status("a").ended:  # (its effect may have finished by now: a cancel of an ended case is refused)
            await sub.cancel("a", compensate=False)


async def test_refused_store_commands_create_or_change_no_file(here: Path) -> None:
    """A mistyped path, a missing directory or a file that is not a store: exit 1, and the directory is as before."""
    (here / "notes.db").write_text("not a store")

    def listing() -> dict[str, bytes]:
        return {
            str(p.relative_to(here)): p.read_bytes() for p in here.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    before = listing()
    for store in ("typo.db", "nowhere/x.db", "notes.db"):
        for args in (["signal", store, "c", "go", "1"], ["prune", store, "--older-than", "1d"],
                     ["graph", "atkflows:order", "--case", "c", "--store", store]):
            ran = await wfsub(here, *args)
            assert ran.code == 1 and ran.out == "" and "Error:" in ran.err, (args, ran)
    assert listing() == before


async def test_replay_flags_a_case_the_new_version_would_suspend(here: Path) -> None:
    """The pre-deploy check agrees with the deploy: a case parked on a timer the new version does not arm fails it."""
    async with Substrate(store=here / "timed.db", workflows=module("atktimed_v1").W) as sub:
        handle = await sub.new_case("flow", case_id="c1")
        await settled(handle, "waiting_timer")
    ran = await wfsub(here, "replay", "timed.db", "c1", "-w", "atktimed_v2:W")
    assert ran.code == 1, ran.out + ran.err
    assert "c1" in ran.out


async def test_replay_all_reports_every_case_even_past_one_whose_workflow_is_missing(here: Path) -> None:
    """A pre-deploy check over a store lists every case, marking the ones it cannot replay, and exits 1."""
    async with owner(here) as sub:
        for workflow, case_id in (("order", "o1"), ("saga", "s1"), ("order", "o2")):
            await settled(await sub.new_case(workflow, {"amount": 1}, case_id=case_id), "waiting_signal")
    ran = await wfsub(here, "replay", "cases.db", "--all", "-w", "atkflows:ORDERS_ONLY")
    assert ran.code == 1
    assert "o2" in ran.out and "o1" in ran.out and "s1" in ran.out + ran.err


async def test_graph_of_a_case_that_ran_another_workflow_is_a_clean_error(here: Path) -> None:
    """A case that cannot be drawn on the given workflow gets `Error: ...` and exit 1, not a traceback."""
    async with owner(here) as sub:
        await settled(await sub.new_case("saga", case_id="s1"), "waiting_signal")
    ran = await wfsub(here, "graph", "atkflows:order", "--case", "s1", "--store", "cases.db")
    assert ran.code == 1
    assert "Traceback" not in ran.err and ran.err.startswith("Error:")


async def test_cancel_with_an_empty_reason_is_refused_and_sends_nothing(here: Path) -> None:
    """An empty --reason is a usage error, as Substrate.cancel(reason='') is a TypeError; the case goes on."""
    async with owner(here) as sub:
        handle = await sub.new_case("order", {"amount": 1}, case_id="o1")
        await settled(handle, "waiting_signal")
        ran = await wfsub(here, "cancel", "cases.db", "o1", "--reason", "")
        await anyio.sleep(0.5)  # an input that was sent would have been applied by now
        assert ran.code == 2 and "reason" in ran.err
        assert handle.status().state == "waiting_signal"


async def test_show_keeps_what_redact_hides_out_of_its_output(here: Path) -> None:
    """A Substrate given redact= leaves nothing in the store that `wfsub show` prints the secret from."""
    async with Substrate(store=here / "r.db", workflows={"pay": DECLINE}, redact=_redact) as sub:
        handle = await sub.new_case("pay", {"card": CARD}, case_id="p1")
        with pytest.raises(CaseFailed):
            await handle.result()
    ran = await wfsub(here, "show", "r.db", "p1", "--json")
    assert ran.code == 0, ran.err
    assert CARD not in ran.out


# -- diagrams ------------------------------------------------------------------------------------------------------


async def test_a_case_inside_a_called_workflow_can_be_highlighted() -> None:
    """highlight=status().at works wherever the case is, a called workflow included (the call node, at least)."""
    async with Substrate(workflows={"inner": INNER, "outer": OUTER}) as sub:
        handle = await sub.new_case("outer")
        await settled(handle, "waiting_signal")
        at = handle.status().at
        await handle.cancel()
    assert at
    for draw in (to_mermaid, to_dot):
        assert draw(OUTER, highlight=at) != draw(OUTER)


async def test_live_positions_in_every_compound_construct_highlight_and_render() -> None:
    """status().at inside every compound construct highlights both formats, and the DOT renders with Graphviz."""
    # Cases park in a compensation, an on_error or on_cancel branch, a net, an mi and a blocking par.
    release = anyio.Event()

    async def held(ctx: Mapping[str, Any]) -> None:
        await release.wait()

    def t(name: str) -> Any:
        return task(_noop, name=name)

    flows = {
        "compensation": saga((t("s1"), seq(t("u0"), wait("undo_ok"))), wait("go")),
        "on_error": seq(scope("r", task(_boom, name="boom"), on_error=wait("fix")), t("after")),
        "on_cancel": seq(scope("r", wait("go"), on_cancel=wait("undo_ok")), t("after")),
        "net": net({"a": t("a"), "b": mi(wait("go"), count=2)}, [("start", "a"), ("a", "b"), ("b", "end")]),
        "mi_effect": mi(effect(held, name="held"), count=2, name="m"),
        "blocking": par(wait("go"), wait("go2"), join="first", blocking=True),
    }
    async with Substrate(workflows=flows) as sub:
        for name, term in flows.items():
            handle = await sub.new_case(name)
            await anyio.sleep(0.05)
            if name == "compensation":
                await handle.cancel()
            if name == "on_cancel":
                await sub.cancel_region(handle.case_id, "r")
            await anyio.sleep(0.05)
            at = handle.status().at
            assert at, name
            assert to_mermaid(term, highlight=at) != to_mermaid(term), name
            dot = to_dot(term, highlight=at)
            assert dot != to_dot(term), name
            assert parse_dot(dot).marked, name  # a real DOT parser reads it, with the marked nodes
            if shutil.which("dot"):  # and Graphviz renders it where installed
                rendered = await anyio.run_process(["dot", "-Tsvg"], input=dot.encode(), check=False)
                assert rendered.returncode == 0, (name, rendered.stderr)
            await handle.cancel(compensate=False)
        release.set()


# -- OpenTelemetry ---------------------------------------------------------------------------------------------------


async def test_the_span_of_a_case_resumed_from_the_store_names_its_workflow(tmp_path: Path) -> None:
    """After a restart, the case span of a resumed case still carries its workflow and the root node path."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    db = tmp_path / "o.db"
    async with Substrate(store=db, workflows={"two": TWO_WAITS}, sinks=[OTelSink(provider)]) as sub:
        await settled(await sub.new_case("two", case_id="c1"), "waiting_signal")
    exporter.clear()
    async with Substrate(store=db, workflows={"two": TWO_WAITS}, sinks=[OTelSink(provider)]) as sub:
        await sub.signal("c1", "go")
        await sub.signal("c1", "go2")
        await sub.await_case("c1")
    roots = [s for s in exporter.get_finished_spans() if s.parent is None]
    assert len(roots) == 1
    attributes = dict(roots[0].attributes or {})
    assert attributes.get("wfsub.workflow") == "two" and roots[0].name == "case two"
    assert attributes.get("wfsub.node_path") == "seq"


# -- examples/fastapi_orders.py ----------------------------------------------------------------------------------------

EXAMPLE = Path(__file__).parents[2] / "examples" / "fastapi_orders.py"
ORDER = {"order_id": "A-1", "lines": [{"sku": "lamp", "qty": 2, "price": 10.0}]}


@pytest.fixture
def store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORDERS_STORE", str(tmp_path / "orders.db"))


@asynccontextmanager
async def serving() -> AsyncIterator[httpx.AsyncClient]:
    """The example app with its lifespan; app errors come back as 500 responses, as a real server sends them."""
    spec = importlib.util.spec_from_file_location("fastapi_orders_attack", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules["fastapi_orders_attack"] = example
    try:
        spec.loader.exec_module(example)
        app = example.app
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://orders") as http:
                yield http
    finally:
        sys.modules.pop("fastapi_orders_attack", None)


async def until(http: httpx.AsyncClient, case_id: str, state: str) -> None:
    with anyio.fail_after(10):
        while (await http.get(f"/orders/{case_id}")).json().get("state") != state:  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def test_cancelling_an_order_twice_still_refunds_it(store_env: None) -> None:
    """However often a customer presses cancel, a paid order is refunded once it is cancelled."""
    async with serving() as client:
        assert (await client.post("/orders", json=ORDER)).status_code == 201
        await until(client, "A-1", "waiting_signal")
        first = await client.post("/orders/A-1/cancel")
        second = await client.post("/orders/A-1/cancel")
        assert first.status_code == 202 and second.status_code in (202, 409)
        await until(client, "A-1", "cancelled")
        assert (await client.get("/orders/A-1/data")).json().get("refunded") == 20.0


async def test_orders_started_at_once_and_started_twice(store_env: None) -> None:
    """Ten orders started concurrently all start; the same order posted twice at once is one order, 201 twice."""
    async with serving() as client:
        codes: list[int] = []

        async def start(order_id: str) -> None:
            codes.append((await client.post("/orders", json={**ORDER, "order_id": order_id})).status_code)

        async with anyio.create_task_group() as tg:
            for i in range(10):
                tg.start_soon(start, f"B-{i}")
            tg.start_soon(start, "twice")
            tg.start_soon(start, "twice")
        assert sorted(codes) == [201] * 12
        listed = (await client.get("/orders", params={"limit": 100})).json()
        assert len(listed) == 11


async def test_the_result_of_a_cancelled_order_is_a_conflict_not_a_server_error(store_env: None) -> None:
    """Asking for the result of an order that will never ship says so (409/410), it does not crash."""
    async with serving() as client:
        assert (await client.post("/orders", json=ORDER)).status_code == 201
        await until(client, "A-1", "waiting_signal")
        assert (await client.post("/orders/A-1/cancel")).status_code == 202
        await until(client, "A-1", "cancelled")
        response = await client.get("/orders/A-1/result")
        assert response.status_code in (409, 410), response.text
        assert "cancel" in response.json()["detail"]


async def test_an_order_id_with_surrounding_spaces_is_a_422(store_env: None) -> None:
    """A body the service cannot take is a 422 saying why, never a 500."""
    async with serving() as client:
        response = await client.post("/orders", json={**ORDER, "order_id": " A-1"})
        assert response.status_code == 422, response.text


async def test_a_huge_signal_payload_is_refused_as_too_large(store_env: None) -> None:
    """A payload over the store's limit is refused with 413 (or 422) and the order waits on."""
    async with serving() as client:
        assert (await client.post("/orders", json=ORDER)).status_code == 201
        await until(client, "A-1", "waiting_signal")
        response = await client.post("/orders/A-1/signals/approve", json={"by": "x" * (2 << 20)})
        assert response.status_code in (413, 422), response.text
        assert (await client.get("/orders/A-1")).json()["state"] == "waiting_signal"


async def test_an_empty_cancel_reason_is_a_422(store_env: None) -> None:
    """An empty reason is a bad request; the order is not cancelled."""
    async with serving() as client:
        assert (await client.post("/orders", json=ORDER)).status_code == 201
        await until(client, "A-1", "waiting_signal")
        response = await client.post("/orders/A-1/cancel", params={"reason": ""})
        assert response.status_code == 422, response.text
        assert (await client.get("/orders/A-1")).json()["state"] == "waiting_signal"


async def test_the_404_detail_names_the_unknown_order(store_env: None) -> None:
    """A 404 names the id that was asked for and what to do, once."""
    async with serving() as client:
        response = await client.get("/orders/nope")
        assert response.status_code == 404
        assert response.json()["detail"] == "no order 'nope': GET /orders lists them"


async def test_an_order_that_was_created_can_be_looked_up(store_env: None) -> None:
    """An id the service accepts is one its own routes can address (or it is refused with 422 up front)."""
    async with serving() as client:
        response = await client.post("/orders", json={**ORDER, "order_id": "shop/7"})
        if response.status_code == 422:
            return
        assert response.status_code == 201
        assert (await client.get("/orders/shop%2F7")).status_code == 200

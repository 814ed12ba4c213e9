"""Attacks on what wfsub's messages, listings and views say to an operator, through the public API and the
`wfsub` command only.

Each test pins what a person reads: a fault found here (now fixed), or behaviour that was checked and found right.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

import wfsub
from wfsub import (
    CaseHandle,
    InvalidStartData,
    JsonlSink,
    Retry,
    SignalRejected,
    StructlogSink,
    Substrate,
    effect,
    saga,
    scope,
    seq,
    sleep,
    task,
    wait,
)
from wfsub.cli import main

from .. import _warm

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00")


class App(BaseModel):
    applicant: str
    amount: int


class Pay(BaseModel):
    amount: int


class Declined(Exception):
    pass


async def _when(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"when": datetime(2026, 1, 1, tzinfo=UTC)}


async def _pay(ctx: Mapping[str, Any]) -> None:
    raise Declined("card 42 declined")


def _reserve(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"reserved": True}


def _undo(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"undone": True}


def _undo_fails(ctx: Mapping[str, Any]) -> None:
    raise RuntimeError("undo broke")


def _boom(ctx: Mapping[str, Any]) -> None:
    raise ValueError("card declined")


W: dict[str, Any] = {
    "bad": seq(effect(_when, name="score", retry=Retry(max_attempts=3))),
    "sag": seq(saga((task(_reserve, name="reserve"), task(_undo, name="undo")), wait("go"))),
    "sagfail": seq(saga((task(_reserve, name="reserve"), task(_undo_fails, name="undo_fails")), wait("go"))),
    "failing": seq(saga((task(_reserve, name="reserve"), task(_undo, name="undo")), task(_boom, name="check"))),
    "typed": seq(wait("first"), wait("pay", model=Pay)),
    "reg": scope("R", wait("a")),
    "raising": seq(effect(_pay, name="pay", retry=Retry(max_attempts=1))),
    "loan": wfsub.Workflow(seq(wait("x")), input=App),
}
WREF = f"{__name__}:W"


async def _settled(handle: CaseHandle, state: str) -> None:
    with anyio.fail_after(5):
        while handle.status().state != state:  # noqa: ASYNC110 - polling the public status
            await anyio.sleep(0.01)


async def _build(db: Path) -> dict[str, str]:
    said: dict[str, str] = {}
    async with Substrate(store=db, workflows=W) as sub:
        hs = {n: await sub.new_case(n, {}, case_id=n) for n in ("bad", "sag", "sagfail", "failing", "typed", "reg",
                                                                  "raising")}
        for n in ("bad", "failing", "raising"):
            await _settled(hs[n], "failed")
        for n in ("sag", "sagfail", "typed", "reg"):
            await _settled(hs[n], "waiting_signal")
        with pytest.raises(SignalRejected) as bad_payload:
            await hs["typed"].signal("pay", {"amount": "zz"})
        said["payload"] = str(bad_payload.value)
        with pytest.raises(SignalRejected) as unknown:
            await hs["typed"].signal("nope", {})
        said["unknown"] = str(unknown.value)
        await sub.cancel("sag", compensate=True, reason="customer asked")
        await sub.cancel("sagfail", compensate=True, reason="customer asked")
        await sub.cancel_region("reg", "R")
        for n in ("sag", "sagfail", "reg"):
            with anyio.fail_after(5):
                while hs[n].status().state not in ("cancelled", "failed"):  # noqa: ASYNC110
                    await anyio.sleep(0.01)
        said["bad_error"] = str(hs["bad"].status().error)
        said["bad_steps"] = str(hs["bad"].status().failure)
        with pytest.raises(InvalidStartData) as start:
            await sub.new_case("loan", {"amount": "x"}, case_id="L-1")
        said["start"] = str(start.value)
        said["start_errors"] = json.dumps([e["loc"] for e in start.value.errors], default=str)
    async with wfsub.Client(store=db) as client:
        with pytest.raises(InvalidStartData) as cstart:
            await client.new_case("loan", {"amount": "x"}, case_id="L-2")
        said["cstart"] = str(cstart.value)
        said["cstart_errors"] = json.dumps([e["loc"] for e in cstart.value.errors], default=str)
    return said


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """One store holding a case for each claim, built once; the command reads it after the owner closed."""
    db = tmp_path_factory.mktemp("messages") / "cases.db"
    said = anyio.run(_build, db)
    return db, said


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*args], env={"COLUMNS": "300"})
    return result.exit_code, result.output


def test_a_non_json_effect_result_names_path_fix_and_no_retry(store: tuple[Path, dict[str, str]]) -> None:
    """The error names the effect, its path, the value's path, the fix and that it is not retried."""
    _, said = store
    msg = said["bad_error"]
    for words in ("effect 'score'", "seq[0].effect", "not JSON", 'result["when"]', ".isoformat()", "not retried"):
        assert words in msg
    assert "EffectResultError" in said["bad_steps"]


def test_the_show_command_says_the_non_json_result_in_full(store: tuple[Path, dict[str, str]]) -> None:
    """`wfsub show` of that case says the effect returned data that is not JSON, and the fix."""
    db, _ = store
    code, out = run("show", str(db), "bad")
    assert code == 0
    assert "EffectResultError" in out and "not JSON" in out and ".isoformat()" in out and "not retried" in out


def test_signal_refusals_name_the_wait_and_where_the_case_waits(store: tuple[Path, dict[str, str]]) -> None:
    """A refused payload names the wait taking it and where the case waits now; an unknown name lists the waits."""
    _, said = store
    assert "seq[1].wait" in said["payload"] and "signal 'first' at seq[0].wait" in said["payload"]
    assert "pay at seq[1].wait" in said["unknown"] and "signal 'first' at seq[0].wait" in said["unknown"]


def test_the_signal_command_refusal_says_where_the_case_waits(store: tuple[Path, dict[str, str]]) -> None:
    """`wfsub signal` refusing a payload says the case waits now for signal 'first' at seq[0].wait."""
    db, _ = store
    code, out = run("signal", str(db), "typed", "pay", '{"amount": "z"}')
    assert code == 1 and "seq[1].wait" in out
    assert "seq[0].wait" in out


async def _client_refusals(db: Path) -> list[str]:
    said = []
    async with wfsub.Client(store=db) as client:
        handle = await client.handle("typed")
        for name, payload in (("pay", {"amount": "z"}), ("nope", {})):
            with pytest.raises(SignalRejected) as refused:
                await handle.signal(name, payload)
            said.append(str(refused.value))
    return said


def test_a_client_refusal_says_where_the_case_waits(store: tuple[Path, dict[str, str]]) -> None:
    """A Client's refused payload and unknown signal name the waits and say the case waits at seq[0].wait."""
    db, _ = store
    payload, unknown = anyio.run(_client_refusals, db)
    assert "seq[1].wait" in payload and "pay at seq[1].wait" in unknown
    assert "signal 'first' at seq[0].wait" in payload and "signal 'first' at seq[0].wait" in unknown


def test_show_lists_compensations_of_a_failed_and_a_cancelled_case(store: tuple[Path, dict[str, str]]) -> None:
    """`wfsub show` lists the compensation a failure ran and the one a cancel ran, each with its outcome."""
    db, _ = store
    for case in ("failing", "sag"):
        code, out = run("show", str(db), case)
        assert code == 0 and "compensated" in out and "undo" in out and "done" in out


def test_show_names_the_path_of_a_task_compensation(store: tuple[Path, dict[str, str]]) -> None:
    """`wfsub show --json` gives each compensation's node path."""
    db, _ = store
    code, out = run("show", str(db), "sag", "--json")
    assert code == 0
    assert all(c["path"] for c in json.loads(out)["compensations"])


def test_a_failed_task_compensation_is_named_in_the_error_show_prints(store: tuple[Path, dict[str, str]]) -> None:
    """A cancel whose task compensation raised ends failed, and `show` names that compensation's path and error."""
    db, _ = store
    code, out = run("show", str(db), "sagfail")
    assert code == 0 and "failed" in out and "CompensationFailed" in out
    assert "seq[0].saga[0.compensation].task" in out and "undo broke" in out


def test_show_lists_a_failed_task_compensation_of_a_cancel_with_its_outcome(
    store: tuple[Path, dict[str, str]],
) -> None:
    """`wfsub show --json` of a cancel whose compensation raised lists it as failed and keeps the cancel's reason."""
    db, _ = store
    code, out = run("show", str(db), "sagfail", "--json")
    assert code == 0
    shown = json.loads(out)
    assert [c["outcome"] for c in shown["compensations"]] == ["failed"]
    assert shown["cancel_reason"] == "customer asked"


def test_trace_shows_replayed_failures_by_their_own_type(store: tuple[Path, dict[str, str]]) -> None:
    """`wfsub trace` shows a task's and an effect's failure with the step's error type and message."""
    db, _ = store
    code, out = run("trace", str(db), "failing", "--workflow", WREF)
    assert code == 0 and 'type="ValueError"' in out and "card declined" in out and "RestoredError" not in out
    code, out = run("trace", str(db), "raising", "--workflow", WREF)
    assert code == 0 and 'type="Declined"' in out and "card 42 declined" in out and "RestoredError" not in out


def test_trace_text_keeps_the_words_of_a_non_json_result_failure(store: tuple[Path, dict[str, str]]) -> None:
    """`wfsub trace --level full` shows that the effect's result was not JSON, and the fix."""
    db, _ = store
    code, out = run("trace", str(db), "bad", "--workflow", WREF, "--level", "full")
    assert code == 0 and 'type="EffectResultError"' in out
    assert "not JSON" in out and ".isoformat()" in out


def test_trace_json_keeps_the_non_json_result_failure_whole(store: tuple[Path, dict[str, str]]) -> None:
    """`wfsub trace --json` carries the failure's whole message: not JSON, the path, the fix, not retried."""
    db, _ = store
    code, out = run("trace", str(db), "bad", "--workflow", WREF, "--json")
    failures = [json.loads(line) for line in out.splitlines() if json.loads(line)["kind"] == "failure"]
    assert code == 0 and failures
    error = failures[0]["detail"]["error"]
    assert "not JSON" in error and 'result["when"]' in error and "not retried" in error


def test_a_region_cancel_that_ends_the_case_says_which_and_why(store: tuple[Path, dict[str, str]]) -> None:
    """`wfsub show` of a case its region's cancel ended names the region and why it ended the case."""
    db, _ = store
    code, out = run("show", str(db), "reg")
    assert code == 0 and "cancel_region('R') ended it" in out and "held every thread" in out


def test_a_bad_start_is_refused_by_the_owner_and_a_client_with_pydantics_errors(
    store: tuple[Path, dict[str, str]],
) -> None:
    """new_case and Client.new_case refuse bad start data with InvalidStartData naming the model and the fields."""
    _, said = store
    for key in ("start", "cstart"):
        assert "does not fit App" in said[key] and "applicant" in said[key] and "nothing was started" in said[key]
        assert "applicant" in said[f"{key}_errors"] and "amount" in said[f"{key}_errors"]


def test_times_people_read_are_iso_with_their_zone(store: tuple[Path, dict[str, str]]) -> None:
    """`cases`, `show`, `trace` print ISO 8601 with +00:00; `journal` and `--json` keep the epoch, ISO beside."""
    db, _ = store
    for args in (("cases", str(db)), ("show", str(db), "sag"), ("trace", str(db), "sag", "--workflow", WREF)):
        code, out = run(*args)
        assert code == 0 and ISO.search(out), args
        assert not re.search(r"\b1[78]\d{8}\.\d+", out), args
    code, out = run("journal", str(db), "sag")
    for line in out.splitlines():
        rec = json.loads(line)
        assert isinstance(rec["time"], float) and ISO.fullmatch(rec["time_iso"])
    code, out = run("show", str(db), "sag", "--json")
    shown = json.loads(out)
    assert isinstance(shown["started_at"], float) and ISO.fullmatch(shown["started_at_iso"])


def _first(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"first": True}


V1 = {"flow": seq(task(_first, name="first"), sleep(3600), wait("go"))}
# The next version waits first and sleeps after: a case parked on v1's timer has no such timer on v2.
V2 = {"flow": seq(task(_first, name="first"), wait("go"), sleep(3600))}


async def _suspend(db: Path) -> None:
    async with Substrate(store=db, workflows=V1) as sub:
        await _settled(await sub.new_case("flow", {}, case_id="s1"), "waiting_timer")
    async with Substrate(store=db, workflows=V2) as sub:
        await _settled(sub.handle("s1"), "suspended")


def test_cases_lists_a_suspended_case_as_waiting_for_a_version_first(tmp_path: Path) -> None:
    """`wfsub cases` says a suspended case waits first for a version that can run it, with the reason."""
    db = tmp_path / "cases.db"
    anyio.run(_suspend, db)
    code, out = run("cases", str(db))
    assert code == 0 and "suspended" in out
    waiting = out.split("suspended", 1)[1]
    assert waiting.index("a workflow version that can run it") < waiting.index("timer")
    assert "seq[1].sleep" in waiting and "register the version the case started on" in waiting
    code, out = run("cases", str(db), "--json")
    assert "seq[1].sleep" in json.loads(out.splitlines()[0])["suspended_reason"]


async def _one_case(*sinks: Any) -> None:
    async with Substrate(workflows={"x": seq(task(_first, name="first"))}, sinks=list(sinks)) as sub:
        await _settled(await sub.new_case("x", {}, case_id="f"), "done")


async def test_structlog_sink_logs_the_epoch_and_the_iso_time(caplog: pytest.LogCaptureFixture) -> None:
    """StructlogSink, through plain logging, gives each event `time` and `time_iso` with its zone."""
    with caplog.at_level(logging.INFO, logger="wfsub.trace"):
        await _one_case(StructlogSink())
    messages = [r.getMessage() for r in caplog.records if r.name == "wfsub.trace"]
    assert messages and all("time=" in m and "time_iso=" in m and ISO.search(m) for m in messages)


async def test_jsonl_sink_writes_the_iso_time_beside_the_epoch(tmp_path: Path) -> None:
    """JsonlSink gives each event `time` and `time_iso` with its zone, as the command's JSON does."""
    path = tmp_path / "trace.jsonl"
    await _one_case(JsonlSink(path))
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        assert isinstance(rec["time"], float) and ISO.fullmatch(rec["time_iso"])


async def test_the_region_cancel_command_says_the_cancel_ended_the_case_and_why(tmp_path: Path) -> None:
    """`wfsub cancel --region R` on a region holding the rest of the case says the case ended, and why."""
    db = tmp_path / "cases.db"
    async with Substrate(store=db, workflows=W) as sub:
        await _settled(await sub.new_case("reg", {}, case_id="reg"), "waiting_signal")
        proc = await _warm.acommand("cancel", str(db), "reg", "--region", "R", env={**os.environ, "COLUMNS": "300"})
        await _settled(sub.handle("reg"), "cancelled")
    said = proc.stderr + proc.stdout
    assert proc.returncode == 0 and "region 'R'" in said
    assert "held every thread" in said

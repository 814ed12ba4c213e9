"""The `wfsub` command, run as a subprocess against a real SQLite store with a live Substrate in the test."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import anyio
import pytest

from wfsub import CaseCancelled, JournalRecord, Substrate, TraceEvent

from .. import _warm

pytestmark = pytest.mark.anyio

FLOWS = """
from wfsub import cancel_region, effect, par, scope, seq, task, wait

def reserve(d):
    return {"reserved": True}

async def charge(d):
    return {"charged": d["amount"]}

def ship(d):
    return {"shipped": True}

order = seq(task(reserve), wait("approve"), effect(charge, name="charge"), task(ship))
guarded = seq(task(reserve), par(scope("review", wait("approve")), task(ship)))
WORKFLOWS = {"order": order, "guarded": guarded}
broken = seq(task(reserve), cancel_region("nowhere"))
not_a_workflow = 42


def hide(value):
    if isinstance(value, dict):
        return {k: hide(v) for k, v in value.items()}
    return "[hidden]" if value == "approve" else value
"""

# The same workflows, except that reserve records another value: replaying on it diverges.
FLOWS_V2 = FLOWS.replace('{"reserved": True}', '{"reserved": "maybe"}')


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Ran(NamedTuple):
    code: int
    out: str
    err: str


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    """A directory holding the workflow modules, importable by the test as by the command."""
    (tmp_path / "cliflows.py").write_text(FLOWS)
    (tmp_path / "cliflows_v2.py").write_text(FLOWS_V2)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("cliflows", "cliflows_v2"):
            sys.modules.pop(name, None)


def flows() -> ModuleType:
    return importlib.import_module("cliflows")


async def wfsub(here: Path, *args: str, env: dict[str, str] | None = None) -> Ran:
    """Run `python -m wfsub ARGS` in `here`, without blocking the Substrate running in this event loop."""
    proc = await _warm.acommand(*args, cwd=here, env={**os.environ, "COLUMNS": "200", **(env or {})})
    return Ran(proc.returncode, proc.stdout, proc.stderr)


@asynccontextmanager
async def owner(here: Path) -> AsyncIterator[Substrate]:
    async with Substrate(store=here / "cases.db", workflows=flows().WORKFLOWS) as sub:
        yield sub


async def test_cases_show_data_and_journal_read_what_the_owner_recorded(here: Path) -> None:
    """cases lists newest first with filters and JSON; show, data and journal match the Substrate's own view."""
    async with owner(here) as sub:
        for i in range(3):
            await sub.new_case("order", {"amount": i}, case_id=f"o{i}")
        await sub.new_case("guarded", {"amount": 9}, case_id="g")
        await anyio.sleep(0.1)

        ran = await wfsub(here, "cases", "cases.db")
        assert ran.code == 0, ran.err
        lines = ran.out.splitlines()
        assert lines[0].split()[:3] == ["CASE", "WORKFLOW", "STATE"]
        assert [line.split()[0] for line in lines[1:]] == ["g", "o2", "o1", "o0"]
        assert "waiting_signal" in lines[1] and "signal approve" in lines[1]

        ran = await wfsub(here, "cases", "cases.db", "--workflow", "order", "--limit", "2", "--json")
        page = [json.loads(line) for line in ran.out.splitlines()]
        assert [c["case_id"] for c in page] == ["o2", "o1"]
        assert "--before" in ran.err  # a full page says how to get the next one
        ran = await wfsub(here, "cases", "cases.db", "--before", str(page[-1]["order"]), "--json")
        assert [json.loads(line)["case_id"] for line in ran.out.splitlines()] == ["o0"]

        ran = await wfsub(here, "show", "cases.db", "o1")
        assert ran.code == 0, ran.err
        assert "waiting_signal" in ran.out and "seq[1].wait" in ran.out and "signal 'approve'" in ran.out
        ran = await wfsub(here, "show", "cases.db", "o1", "--json")
        shown = json.loads(ran.out)
        assert (shown["state"], shown["at"], shown["workflow"]) == ("waiting_signal", ["seq[1].wait"], "order")

        ran = await wfsub(here, "data", "cases.db", "o1")
        assert json.loads(ran.out) == sub.data("o1") == {"amount": 1, "reserved": True}

        ran = await wfsub(here, "journal", "cases.db", "o1")
        lines = [json.loads(line) for line in ran.out.splitlines()]
        assert all(line.pop("time_iso").endswith("+00:00") for line in lines)  # beside the epoch: for people
        records = [JournalRecord.model_validate(line) for line in lines]
        assert records == await sub.journal("o1")
        assert records[0].kind == "start"


async def test_show_and_cases_print_no_trailing_spaces(here: Path) -> None:
    """`wfsub show` and `wfsub cases` end each line at its last character: no cell pads it to its column's width."""
    async with owner(here) as sub:
        await sub.new_case("order", {"amount": 1}, case_id="a-case-with-a-much-longer-id")
        await sub.new_case("order", {"amount": 2}, case_id="b")
        for args in (("show", "cases.db", "a-case-with-a-much-longer-id"), ("cases", "cases.db")):
            ran = await wfsub(here, *args)
            assert ran.code == 0, ran.err
            assert len(ran.out.splitlines()) > 2
            assert [line for line in ran.out.splitlines() if line != line.rstrip()] == []


async def test_bad_input_is_refused_on_stderr_with_the_fix_and_changes_nothing(here: Path) -> None:
    """Unknown case, missing or foreign store file, a memory store, limit 0: a message on stderr, non-zero exit."""
    async with owner(here) as sub:
        await sub.new_case("order", {"amount": 1}, case_id="o1")
        before = [r.model_dump() for r in await sub.journal("o1")]

        ran = await wfsub(here, "show", "cases.db", "nope")
        assert ran.code == 1 and ran.out == ""
        assert "no case 'nope'" in ran.err and "wfsub cases " in ran.err

        ran = await wfsub(here, "cases", "missing.db")
        assert ran.code == 1 and "no store file here" in ran.err and "check the path" in ran.err
        assert not (here / "missing.db").exists()  # a mistyped path does not become a new store

        (here / "other.db").write_bytes(b"")
        ran = await wfsub(here, "cases", "other.db")
        assert ran.code == 1 and "not a wfsub store" in ran.err
        assert (here / "other.db").read_bytes() == b""

        with closing(sqlite3.connect(here / "foreign.db")) as conn:
            conn.execute("create table t(x)")
        ran = await wfsub(here, "cases", "foreign.db")
        assert ran.code == 1 and "not a wfsub store" in ran.err

        ran = await wfsub(here, "cases", "memory:")
        assert ran.code == 1 and "memory store lives inside one process" in ran.err

        ran = await wfsub(here, "cases", "cases.db", "--limit", "0")
        assert ran.code == 2 and "0 is not in the range x>=1" in ran.err

        ran = await wfsub(here, "cases")
        assert ran.code == 2 and "Missing argument 'STORE'" in ran.err

        ran = await wfsub(here, "signal", "cases.db", "o1", "approve", "{not json")
        assert ran.code == 2 and "is not JSON" in ran.err
        assert [r.model_dump() for r in await sub.journal("o1")] == before


async def test_signal_reaches_the_live_owner_and_a_refusal_is_reported(here: Path) -> None:
    """A signal from the command is recorded by the running owner; a wrong name is refused, the case unchanged."""
    async with owner(here) as sub:
        handle = await sub.new_case("order", {"amount": 5}, case_id="o5")
        await anyio.sleep(0.05)
        journal_before = [r.model_dump() for r in await sub.journal("o5")]

        ran = await wfsub(here, "signal", "cases.db", "o5", "aprove", '{"by": "ann"}')
        assert ran.code == 1
        assert "case 'o5' cannot take signal 'aprove'" in ran.err and "it waits for: approve" in ran.err
        assert "nothing was sent" in ran.err and ran.err.count("case 'o5'") == 1  # the case named once
        assert [r.model_dump() for r in await sub.journal("o5")] == journal_before
        assert sub.status("o5").state == "waiting_signal"

        ran = await wfsub(here, "signal", "cases.db", "o5", "approve", '{"by": "ann"}', "--request-id", "r1")
        assert ran.code == 0, ran.err
        assert "recorded the signal 'approve'" in ran.err
        assert await handle.result() == {
            "amount": 5, "reserved": True, "approve": {"by": "ann"}, "charged": 5, "shipped": True
        }

        ran = await wfsub(here, "signal", "cases.db", "o5", "approve", "--request-id", "r1")
        assert ran.code == 0 and "recorded the signal 'approve'" in ran.err and "applied before" in ran.err
        ran = await wfsub(here, "signal", "cases.db", "o5", "approve", "--request-id", "r2")
        assert ran.code == 1 and "it has already ended (done)" in ran.err and "nothing was sent" in ran.err


async def test_a_signal_sent_twice_at_once_with_one_request_id_is_recorded_for_both(here: Path) -> None:
    """Two commands with the same request id at once: both say recorded (exit 0); the journal holds one signal."""
    async with owner(here) as sub:
        handle = await sub.new_case("order", {"amount": 5}, case_id="o6")
        ran: list[Ran] = []

        async def send() -> None:
            ran.append(await wfsub(here, "signal", "cases.db", "o6", "approve", '"x"', "--request-id", "r2"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            tg.start_soon(send)
        assert [r.code for r in ran] == [0, 0], [r.err for r in ran]
        assert all("recorded the signal 'approve'" in r.err for r in ran)
        assert (await handle.result())["approve"] == "x"
        assert [r.kind for r in await sub.journal("o6")].count("signal") == 1


async def test_inputs_queue_while_no_substrate_runs_and_apply_when_one_starts(here: Path) -> None:
    """With no owner running, signal and cancel are queued in the inbox and applied at the next start."""
    async with owner(here) as sub:
        await sub.new_case("order", {"amount": 1}, case_id="a")
        await sub.new_case("order", {"amount": 2}, case_id="b")

    ran = await wfsub(here, "signal", "cases.db", "a", "approve", '"yes"')
    assert ran.code == 0 and "queued: no Substrate owns" in ran.err
    ran = await wfsub(here, "cancel", "cases.db", "b", "--reason", "customer asked")
    assert ran.code == 0 and "queued" in ran.err

    async with owner(here) as sub:
        with anyio.fail_after(10):
            result = await sub.await_case("a")
        assert result["charged"] == 1
        with anyio.fail_after(10), pytest.raises(CaseCancelled, match="customer asked"):
            await sub.await_case("b")


async def test_cancel_a_case_or_a_region_of_it(here: Path) -> None:
    """cancel ends a live case with the reason given; --region cancels one region and the case goes on."""
    async with owner(here) as sub:
        whole = await sub.new_case("order", {"amount": 1}, case_id="whole")
        part = await sub.new_case("guarded", {"amount": 1}, case_id="part")
        await anyio.sleep(0.05)

        ran = await wfsub(here, "cancel", "cases.db", "whole", "--reason", "out of stock")
        assert ran.code == 0, ran.err
        with pytest.raises(CaseCancelled, match="out of stock"):
            await whole.result()

        ran = await wfsub(here, "cancel", "cases.db", "part", "--region", "nowhere")
        assert ran.code == 1 and "case 'part' cannot cancel region 'nowhere'" in ran.err
        ran = await wfsub(here, "cancel", "cases.db", "part", "--region", "review")
        assert ran.code == 0, ran.err
        assert await part.result() == {"amount": 1, "reserved": True, "shipped": True}


async def test_trace_and_replay_rebuild_cases_from_their_journals(here: Path) -> None:
    """trace replays a journal into the events the case produced; replay exits 1 with a report when one diverges."""
    async with owner(here) as sub:
        handle = await sub.new_case("order", {"amount": 3}, case_id="t")
        await sub.new_case("order", {"amount": 4}, case_id="u")
        await sub.signal("t", "approve", {"by": "bo"})
        await handle.result()

        ran = await wfsub(here, "trace", "cases.db", "-w", "cliflows:WORKFLOWS", "t", "--json")
        assert ran.code == 0, ran.err
        events = [TraceEvent.model_validate_json(line) for line in ran.out.splitlines()]
        kinds = [e.kind for e in events]
        assert kinds[0] == "case_started" and kinds[-1] == "case_done"
        assert "signal_consumed" in kinds and "effect_completed" in kinds
        ran = await wfsub(here, "trace", "cases.db", "-w", "cliflows:order", "t", "--level", "min")
        assert ran.code == 0 and "case_done" in ran.out and " step " not in ran.out
        assert 'signal="approve"' in ran.out
        ran = await wfsub(here, "trace", "cases.db", "-w", "cliflows:order", "t", "--redact", "cliflows:hide")
        assert ran.code == 0 and 'signal="[hidden]"' in ran.out and 'signal="approve"' not in ran.out

        ran = await wfsub(here, "replay", "cases.db", "-w", "cliflows:WORKFLOWS", "--all")
        assert ran.code == 0, ran.err
        assert ran.out.split() == ["ok", "u", "waiting", "ok", "t", "done"]
        assert "2 of 2 cases replayed without divergence" in ran.err

        ran = await wfsub(here, "replay", "cases.db", "-w", "cliflows_v2:WORKFLOWS", "t")
        assert ran.code == 1
        assert ran.out.startswith("DIVERGED  t")
        assert "digest" in ran.out  # says which record stopped matching and why
        assert "note: case 't' ran on version" in ran.out

        ran = await wfsub(here, "replay", "cases.db", "-w", "cliflows:WORKFLOWS")
        assert ran.code == 2 and "give CASE_IDs or --all" in ran.err


async def test_prune_removes_only_ended_cases(here: Path) -> None:
    """prune removes cases that ended before the cutoff and keeps running ones; a bad duration is a usage error."""
    async with owner(here) as sub:
        done = await sub.new_case("order", {"amount": 1}, case_id="done")
        await sub.new_case("order", {"amount": 2}, case_id="running")
        await sub.signal("done", "approve")
        await done.result()

        ran = await wfsub(here, "prune", "cases.db", "--older-than", "1h")
        assert ran.code == 0 and "pruned 0 cases" in ran.err
        ran = await wfsub(here, "prune", "cases.db", "--older-than", "0s")
        assert ran.code == 0 and "pruned 1 case " in ran.err
        ran = await wfsub(here, "cases", "cases.db", "--json")
        assert [json.loads(line)["case_id"] for line in ran.out.splitlines()] == ["running"]

        ran = await wfsub(here, "prune", "cases.db", "--older-than", "soon")
        assert ran.code == 2 and "not a duration" in ran.err


async def test_graph_validate_and_dis_take_module_attribute(here: Path) -> None:
    """graph draws (marking a case's position), validate reports issues with paths, dis lists the bytecode."""
    ran = await wfsub(here, "graph", "cliflows:order")
    assert ran.code == 0 and ran.out.startswith("flowchart")
    ran = await wfsub(here, "graph", "cliflows:WORKFLOWS", "--name", "guarded", "--format", "dot")
    assert ran.code == 0 and ran.out.lstrip().startswith("digraph")
    if shutil.which("dot"):
        rendered = await anyio.run_process(["dot", "-Tsvg"], input=ran.out.encode(), check=False)
        assert rendered.returncode == 0, rendered.stderr
    ran = await wfsub(here, "graph", "cliflows:WORKFLOWS")
    assert ran.code == 1 and "choose one with --name" in ran.err

    async with owner(here) as sub:
        await sub.new_case("order", {"amount": 1}, case_id="o")
        await anyio.sleep(0.05)
        ran = await wfsub(here, "graph", "cliflows:WORKFLOWS", "--case", "o", "-s", "cases.db")
        assert ran.code == 0, ran.err
        marked = [line for line in ran.out.splitlines() if "class" in line and "highlight" in line.lower()]
        assert marked, ran.out

    ran = await wfsub(here, "validate", "cliflows:WORKFLOWS")
    assert ran.code == 0 and "[guarded]: valid" in ran.out and "[order]: valid" in ran.out
    ran = await wfsub(here, "validate", "cliflows:broken")
    assert ran.code == 1 and "seq[1]" in ran.err and "nowhere" in ran.err

    ran = await wfsub(here, "dis", "cliflows:order")
    assert ran.code == 0 and "WAIT" in ran.out and "EFFECT" in ran.out
    ran = await wfsub(here, "dis", "cliflows:broken")
    assert ran.code == 1 and "invalid workflow" in ran.err


async def test_module_attribute_errors_name_the_fix(here: Path) -> None:
    """A bad MODULE:ATTR spec, a missing module or attribute, or a non-workflow attribute each say what to do."""
    cases: list[tuple[str, str]] = [
        ("cliflows", "is not MODULE:ATTRIBUTE"),
        ("nomodule:flow", "cannot import module 'nomodule'"),
        ("cliflows:missing", "has no attribute 'missing'"),
        ("cliflows:not_a_workflow", "is a int, not a workflow"),
    ]
    for spec, message in cases:
        ran = await wfsub(here, "dis", spec)
        assert ran.code == 1, spec
        assert message in ran.err, (spec, ran.err)
    ran = await wfsub(here, "dis", "cliflows:missing")
    assert "workflows there: WORKFLOWS, broken, guarded, order" in ran.err


def test_the_command_is_installed_and_runs_as_a_module() -> None:
    """`wfsub --help` (the console script) and `python -m wfsub --help` list the commands."""
    script = Path(sys.executable).with_name("wfsub")
    for argv in ([str(script), "--help"], [sys.executable, "-m", "wfsub", "--help"]):
        ran = subprocess.run(argv, capture_output=True, text=True, check=True)
        for command in ("cases", "show", "data", "journal", "trace", "signal", "cancel", "replay", "prune",
                        "graph", "validate", "dis"):
            assert command in ran.stdout




async def test_inputs_of_the_wrong_shape_are_refused_before_anything_is_sent(here: Path) -> None:
    """A blank --reason, an empty signal name or region, an empty --request-id: a usage error with the API's words,
    and nothing reaches the case (its journal holds only its start)."""
    async with owner(here) as sub:
        await sub.new_case("order", {"amount": 1}, case_id="o1")
        for args, words in [
            (("cancel", "cases.db", "o1", "--reason", "  "), "reason must be a non-empty str, not blank"),
            (("signal", "cases.db", "o1", ""), "signal names are str (non-empty)"),
            (("cancel", "cases.db", "o1", "--region", ""), "region names are str (non-empty)"),
            (("signal", "cases.db", "o1", "approve", "--request-id", ""), "request_id must be a non-empty str"),
        ]:
            ran = await wfsub(here, *args)
            assert ran.code == 2 and words in " ".join(ran.err.split()), (args, ran.err)
        assert [r.kind for r in await sub.journal("o1")] == ["start"]

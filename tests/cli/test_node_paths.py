"""One spelling of a node path everywhere: the compiler's (`seq[1].xor[default].seq[1].par[0].scope.seq[1].wait`).
`status().at`, `wfsub show` (text and JSON), `wfsub cases --json`, trace events (a live sink and `wfsub trace`),
journal records, replay divergences and `to_mermaid` / `to_dot(highlight=)` give and accept the same strings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

import wfsub
from wfsub import MemorySink, Substrate, effect, mi, par, replay, scope, seq, task, wait, xor
from wfsub.cli import main

SCOPE_WAIT = "seq[1].xor[default].seq[1].par[0].scope.seq[1].wait"
MI_WAIT = "seq[1].xor[default].seq[1].par[1].mi.wait"
EFFECT = "seq[1].xor[default].seq[1].par[0].scope.seq[0].effect"
TASK = "seq[1].xor[default].seq[0].task"
OUTPUT = {"n": 1}  # what the task `d` returns: changed to make a replay diverge


def _prep(ctx: Mapping[str, Any]) -> None:
    return None


def _d(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return dict(OUTPUT)


def _never(data: Mapping[str, Any]) -> bool:
    return False


async def _charge(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"charged": True}


FLOW = seq(
    task(_prep, name="prep"),
    xor(
        (_never, task(_prep, name="x")),
        default=seq(
            task(_d, name="d"),
            par(scope("S", seq(effect(_charge, name="charge"), wait("go"))), mi(wait("each"), count=2, name="M")),
        ),
    ),
)
W = {"w": FLOW}
WREF = f"{__name__}:W"


async def _park(db: Path) -> dict[str, Any]:
    sink = MemorySink()
    async with Substrate(store=db, workflows=W, sinks=[sink]) as sub:
        handle = await sub.new_case("w", {}, case_id="c")
        with anyio.fail_after(10):
            while handle.status().state != "waiting_signal":  # noqa: ASYNC110 - polling the public status
                await anyio.sleep(0.01)
        at = handle.status().at
        journal = [r.model_dump(mode="json") for r in await sub.journal("c")]
    return {"at": at, "events": {e.path for e in sink.events}, "journal": journal}


@pytest.fixture(scope="module")
def parked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A case parked at a wait in a scope and at a wait in an mi, under a par in an xor's default branch."""
    db = tmp_path_factory.mktemp("paths") / "cases.db"
    return db, anyio.run(_park, db)


def run(*args: str) -> str:
    result = CliRunner().invoke(main, [*args], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.output


def test_status_at_is_the_compilers_spelling(parked: tuple[Path, dict[str, Any]]) -> None:
    """status().at gives the node paths the compiled program has, [default] included."""
    _, seen = parked
    assert seen["at"] == (SCOPE_WAIT, MI_WAIT)
    assert {SCOPE_WAIT, MI_WAIT} <= set(wfsub.compile(FLOW).paths)


def test_show_and_cases_print_the_same_paths(parked: tuple[Path, dict[str, Any]]) -> None:
    """`wfsub show` (text and --json) and `wfsub cases --json` give status().at's strings whole."""
    db, seen = parked
    text = run("show", str(db), "c")
    assert SCOPE_WAIT in text and MI_WAIT in text
    assert json.loads(run("show", str(db), "c", "--json"))["at"] == list(seen["at"])
    assert json.loads(run("cases", str(db), "--json").splitlines()[0])["at"] == list(seen["at"])


def test_trace_events_and_journal_records_use_the_same_paths(parked: tuple[Path, dict[str, Any]]) -> None:
    """A live sink, `wfsub trace` (text and --json) and the journal's effect record spell the paths alike."""
    db, seen = parked
    assert {SCOPE_WAIT, MI_WAIT, EFFECT, TASK} <= seen["events"]
    text = run("trace", str(db), "c", "--workflow", WREF)
    assert SCOPE_WAIT in text and MI_WAIT in text and EFFECT in text
    traced = {json.loads(line)["path"] for line in run("trace", str(db), "c", "--workflow", WREF, "--json")
              .splitlines()}
    assert seen["events"] <= traced  # (the command replays at level full: more steps, the same paths)
    effects = [r for r in seen["journal"] if r["kind"] == "effect"]
    assert [r["path"] for r in effects] == [EFFECT]
    journaled = [json.loads(line) for line in run("journal", str(db), "c").splitlines()]
    assert [r["path"] for r in journaled if r["kind"] == "effect"] == [EFFECT]


def test_a_divergence_names_the_task_by_the_same_path(parked: tuple[Path, dict[str, Any]]) -> None:
    """A replay whose task gives another output names it at the compiler's path, [default] included."""
    _, seen = parked
    OUTPUT["n"] = 2
    try:
        divergence = replay(FLOW, seen["journal"]).divergence
    finally:
        OUTPUT["n"] = 1
    assert divergence is not None and f"task 'd' at {TASK}" in str(divergence)


def test_diagrams_accept_the_paths_every_surface_gives(parked: tuple[Path, dict[str, Any]]) -> None:
    """to_mermaid and to_dot take status().at and the paths `wfsub show` printed, and mark those shapes."""
    db, seen = parked
    shown = json.loads(run("show", str(db), "c", "--json"))["at"]
    assert shown == list(seen["at"])
    marked = [line.strip() for line in wfsub.to_mermaid(FLOW, highlight=shown).splitlines()
              if line.strip().startswith("class ") and line.strip().endswith(" highlight")]
    assert marked and len(marked[0].split()[1].split(",")) == 2  # both shapes marked
    assert wfsub.to_mermaid(FLOW, highlight=shown) == wfsub.to_mermaid(FLOW, highlight=seen["at"])
    assert "#ffeb3b" in wfsub.to_dot(FLOW, highlight=shown)
    with pytest.raises(ValueError, match=r"seq\[1\]\.xor\[default\]"):  # a path without [default] is not one
        wfsub.to_mermaid(FLOW, highlight=["seq[1].xor.seq[1].par[0].scope.seq[1].wait"])

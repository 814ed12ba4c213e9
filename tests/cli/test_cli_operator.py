"""What the `wfsub` command tells an operator when an input is refused, sent without waiting, or a replay cannot
run a case, and when a listing has more pages: true, specific, and said once."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner

from wfsub import CaseHandle, Substrate, scope, seq, wait
from wfsub.cli import main

from .. import _warm

W = {"w": seq(wait("a"), scope("R", wait("b")))}
OTHER = {"other": seq(wait("z"))}  # a target without workflow 'w': it cannot replay those cases


async def _waiting(handle: CaseHandle) -> None:
    with anyio.fail_after(10):
        while handle.status().state != "waiting_signal":  # noqa: ASYNC110 - polling the public status
            await anyio.sleep(0.01)


async def _command(*args: str) -> tuple[int, str]:
    """The command as a process of its own (the owner runs in this one), its stdout and stderr together."""
    done = await _warm.acommand(*args, env={**os.environ, "COLUMNS": "300"})
    return done.returncode, done.stdout + done.stderr


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [*args], env={"COLUMNS": "300"})
    return result.exit_code, result.output


async def test_an_owner_refusal_names_the_case_once_and_says_it_is_unchanged(tmp_path: Path) -> None:
    """A region cancel the summary lets through and the owner refuses (the region is not active yet) says so once."""
    db = tmp_path / "cases.db"
    async with Substrate(store=db, workflows=W) as sub:
        await _waiting(await sub.new_case("w", {}, case_id="c"))
        code, said = await _command("cancel", str(db), "c", "--region", "R")
        assert sub.status("c").state == "waiting_signal"
    assert code == 1, said
    assert "case 'c' cannot cancel region 'R'" in said and "not active now" in said
    assert "the case is unchanged" in said and said.count("case 'c'") == 1


async def test_a_signal_sent_without_waiting_names_the_owner_process(tmp_path: Path) -> None:
    """`--no-wait` says which process's inbox holds the signal: its owner id, pid and host."""
    db = tmp_path / "cases.db"
    async with Substrate(store=db, workflows=W) as sub:
        handle = await sub.new_case("w", {}, case_id="c")
        await _waiting(handle)
        code, said = await _command("signal", str(db), "c", "a", "--no-wait")
        with anyio.fail_after(10):
            while handle.status().signals != ("b",):  # noqa: ASYNC110 - the owner takes it
                await anyio.sleep(0.01)
    assert code == 0, said
    assert "sent: the signal 'a' is in the inbox of" in said and f"pid {os.getpid()} on host" in said
    assert "applies it while it runs" in said


async def _two_cases(db: Path) -> None:
    async with Substrate(store=db, workflows=W) as sub:
        for case_id in ("c1", "c2"):
            await _waiting(await sub.new_case("w", {}, case_id=case_id))


@pytest.fixture
def two(tmp_path: Path) -> Path:
    db = tmp_path / "cases.db"
    anyio.run(_two_cases, db)
    return db


def test_replay_counts_a_case_it_could_not_run_apart_from_divergences(two: Path) -> None:
    """A case the target has no workflow for is SKIPPED and counted as not replayed (exit 1), not as diverged."""
    code, said = run("replay", str(two), "c1", "c2", "--workflow", f"{__name__}:OTHER")
    skipped = [line for line in said.splitlines() if line.startswith("SKIPPED")]
    assert code == 1 and len(skipped) == 2 and "has no workflow 'w'" in skipped[0]
    assert "0 of 2 cases replayed without divergence; 2 not replayed" in said and "diverged" not in said
    code, said = run("replay", str(two), "c1", "--workflow", f"{__name__}:W")
    assert code == 0 and "1 of 1 cases replayed without divergence" in said and "not replayed" not in said


def test_a_full_page_of_cases_says_how_to_get_the_next(two: Path) -> None:
    """`wfsub cases -n 1` on two cases says there may be more and the --before that pages on."""
    code, said = run("cases", str(two), "-n", "1")
    assert code == 0 and "c2" in said and "c1" not in said.split("there may be more")[0]
    assert "there may be more: add --before" in said and "for the next page" in said


async def test_a_client_starting_an_unknown_workflow_is_told_the_store_has_none_by_that_name(tmp_path: Path) -> None:
    """A Client's new_case of a misspelled workflow names the store and says to check the name, not 'none'."""
    import wfsub

    db = tmp_path / "cases.db"
    async with Substrate(store=db, workflows=W):
        pass
    async with wfsub.Client(db) as client:
        with pytest.raises(wfsub.WorkflowNotRegistered) as refused:
            await client.new_case("ww", {})
    said = str(refused.value)
    assert "no workflow 'ww' is registered with the store" in said and "check the name" in said
    assert "registered: none" not in said


async def test_show_says_who_runs_a_case_and_when_nobody_does(tmp_path: Path) -> None:
    """`wfsub show` of a waiting case names the owning process while one runs, and says when none does."""
    db = tmp_path / "cases.db"
    async with Substrate(store=db, workflows=W) as sub:
        await _waiting(await sub.new_case("w", {}, case_id="c"))
        code, said = await _command("show", str(db), "c")
    assert code == 0 and "run by" in said and f"pid {os.getpid()} on host" in said
    code, said = await _command("show", str(db), "c")
    assert code == 0 and "no Substrate has the store open now: the case goes on when one opens it" in said


async def test_show_names_the_node_that_runs_a_case_on_postgres() -> None:
    """On Postgres `wfsub show` names the node that owns the case and its process."""
    from wfsub.stores import PostgresStore

    from ..stores import _pg

    if not _pg.ENABLED:
        pytest.skip(_pg.SKIP_REASON)
    dsn, schema = _pg.database_dsn(), _pg.new_schema()
    url = f"{dsn}?schema={schema}" if "?" not in dsn else f"{dsn}&schema={schema}"
    async with Substrate(store=PostgresStore(dsn, schema=schema), workflows=W, node_id="n1") as sub:
        await _waiting(await sub.new_case("w", {}, case_id="c"))
        code, said = await _command("show", url, "c")
    assert code == 0, said
    assert "node 'n1'" in said and f"pid {os.getpid()} on host" in said


async def test_a_signal_that_ends_the_case_says_so_on_its_done_line(tmp_path: Path) -> None:
    """`wfsub signal` whose signal leads the case to its end says, on its one `done:` line, that it is done."""
    db = tmp_path / "cases.db"
    async with Substrate(store=db, workflows=W) as sub:
        handle = await sub.new_case("w", {}, case_id="c")
        await _waiting(handle)
        await handle.signal("a")
        code, went_on = await _command("signal", str(db), "c", "b")
        assert await handle.result(timeout=10) == {"a": None, "b": None}
    assert code == 0, went_on
    assert [line for line in went_on.splitlines() if line] == [
        "done: case 'c' recorded the signal 'b', and the case went on to its end: it is done"
    ]

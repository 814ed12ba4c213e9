"""A request id names one input of one kind on one case: the same call repeated with it is a retry (applied once,
answered as the first was), a call of another kind with it is refused saying which kind used it, through the
owner, a `wfsub.Client` and the `wfsub` command, on MemoryStore, SQLite and Postgres; compaction keeps the kinds,
and an old snapshot's ids (no kinds) match any kind."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from wfsub import CaseState, Client, SignalRejected, Substrate, loop, seq, task, wait
from wfsub._runtime._request_ids import kept_kinds, request_kinds_of, taken

from .. import _warm
from ..processes._http import ROOT
from ._util import eventually, kinds, same_store

BOUND = 30.0  # seconds: a bound against a hang, not a latency requirement


def _yes(ctx: Mapping[str, Any]) -> str:
    return "yes"


FLOWS = {"f": seq(wait("go"), wait("ask", reply=_yes), wait("more"))}


def _used_by(kind: str, rid: str) -> str:
    article = "an" if kind[0] in "aeiou" else "a"
    return rf"request_id '{rid}' was used by {article} {kind} of this case.*pass a fresh request_id"


@pytest.mark.parametrize("door", ["owner", "client"])
@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_a_request_id_reused_by_another_kind_of_input_is_refused_and_its_own_retry_is_not(
    kind: str, door: str, tmp_path: Path
) -> None:
    """A cancel or update with a signal's request id raises SignalRejected naming the signal, on a live case and
    an ended one, and changes nothing; the signal (or update) repeated with its own id returns as it did first."""
    if kind == "memory" and door == "client":
        pytest.skip("a Client opens a store another process can reach: SQLite or Postgres")
    store = same_store(kind, tmp_path)
    node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    async with AsyncExitStack() as stack:
        sub = await stack.enter_async_context(Substrate(store=store(), workflows=FLOWS, **node))
        caller: Any = sub if door == "owner" else await stack.enter_async_context(Client(store()))

        async def waits_for(name: str) -> bool:
            status = sub.status("c")
            return status.state == CaseState.WAITING_SIGNAL and status.signals == (name,)

        await caller.new_case("f", {}, case_id="c")
        await caller.signal("c", "go", None, request_id="r1")
        await eventually(lambda: waits_for("ask"), BOUND)  # journaled (a Client's signal goes through the inbox)
        with pytest.raises(SignalRejected, match=_used_by("signal", "r1")):
            await caller.cancel("c", reason="stop", request_id="r1")
        with pytest.raises(SignalRejected, match=_used_by("signal", "r1")):
            await caller.update("c", "ask", None, request_id="r1")
        await caller.signal("c", "go", None, request_id="r1")  # its own retry: nothing new
        assert await caller.update("c", "ask", None, request_id="u1") == "yes"
        assert await caller.update("c", "ask", None, request_id="u1") == "yes"
        with pytest.raises(SignalRejected, match=_used_by("update", "u1")):
            await caller.signal("c", "more", None, request_id="u1")
        await eventually(lambda: waits_for("more"), BOUND)
        assert kinds(await sub.journal("c")) == ["start", "signal", "signal"]
        await caller.signal("c", "more", None, request_id="m1")
        assert await caller.await_case("c", timeout=BOUND) == {"go": None, "ask": None, "more": None}
        # ended: a retry still returns; another kind with its id is still refused for the id (not for the end)
        await caller.signal("c", "more", None, request_id="m1")
        assert await caller.update("c", "ask", None, request_id="u1") == "yes"
        with pytest.raises(SignalRejected, match=_used_by("signal", "m1")):
            await caller.cancel("c", request_id="m1")
        with pytest.raises(SignalRejected, match=_used_by("signal", "m1")):
            await caller.update("c", "ask", None, request_id="m1")
        with pytest.raises(SignalRejected, match="it has already ended"):
            await caller.cancel("c", request_id="fresh")
        assert kinds(await sub.journal("c")) == ["start", "signal", "signal", "signal", "end"]
        assert sub.status("c").state == CaseState.DONE


def command(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m wfsub ARGS`, as an operator runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return _warm.command(*args, cwd=cwd, env=env)


async def test_the_command_refuses_a_request_id_another_kind_of_input_used_and_sends_nothing(tmp_path: Path) -> None:
    """`wfsub cancel --request-id R` of a live case whose R a signal used exits 1 saying so and sends nothing;
    `wfsub signal --request-id R` of the same signal is a retry."""
    path = tmp_path / "c.db"
    async with Substrate(store=str(path), workflows=FLOWS) as sub:
        await sub.new_case("f", {}, case_id="c")
        await sub.signal("c", "go", None, request_id="r1")
    ran = command("cancel", str(path), "c", "--request-id", "r1", cwd=tmp_path)
    assert ran.returncode == 1, ran
    assert "request_id 'r1' was used by a signal of this case" in ran.stderr, ran.stderr
    assert "nothing was sent" in ran.stderr, ran.stderr
    ran = command("cancel", str(path), "c", "--region", "R", "--request-id", "r1", cwd=tmp_path)
    assert ran.returncode == 1 and "was used by a signal" in ran.stderr, ran
    ran = command("signal", str(path), "c", "go", "--request-id", "r1", "--no-wait", cwd=tmp_path)
    assert ran.returncode == 0, ran
    async with Substrate(store=str(path), workflows=FLOWS) as sub:
        await eventually(lambda: sub.status("c").signals == ("ask",), BOUND)
        assert kinds(await sub.journal("c")) == ["start", "signal"]
        assert sub.status("c").refused == ()


def _count(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1}


ENDLESS = {"cart": loop(seq(wait("add", into="item"), task(_count)), while_=lambda d: True)}


@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
async def test_compaction_keeps_the_kind_of_each_request_id(kind: str, tmp_path: Path) -> None:
    """Ids whose records a compaction removed keep their kinds in its snapshot record: a cancel with one of them
    is refused (owner and Client), a retried signal returns, and a restart reads them back the same."""
    store = same_store(kind, tmp_path)
    node: dict[str, Any] = {"node_id": "n1"} if kind == "postgres" else {}
    async with Substrate(store=store(), workflows=ENDLESS, compact_after=3, **node) as sub:
        await sub.new_case("cart", {}, case_id="c")
        for i in range(8):
            await sub.signal("c", "add", i, request_id=f"s{i}")
        journal = await sub.journal("c")
        assert journal[0].kind == "snapshot" and "s0" not in {r.model_dump().get("request_id") for r in journal}
        assert (journal[0].model_extra or {})["state"]["request_ids"]["s0"] == "signal"
        with pytest.raises(SignalRejected, match=_used_by("signal", "s0")):
            await sub.cancel("c", request_id="s0")
        if kind != "memory":
            async with Client(store()) as client:
                with pytest.raises(SignalRejected, match=_used_by("signal", "s0")):
                    await client.cancel("c", request_id="s0")
    async with Substrate(store=store(), workflows=ENDLESS, compact_after=3, **node) as sub:
        await sub.signal("c", "add", 0, request_id="s0")  # a retry: not applied again
        with pytest.raises(SignalRejected, match=_used_by("signal", "s1")):
            await sub.cancel("c", request_id="s1")
        await eventually(lambda: sub.data("c").get("n") == 8, BOUND)
        assert sub.status("c").state == CaseState.WAITING_SIGNAL


async def test_an_old_snapshot_s_ids_without_kinds_match_any_kind(tmp_path: Path) -> None:
    """A compacted journal written before kinds were kept (its snapshot record lists ids only): those ids are of
    unknown kind and match any kind, so a call with one is taken as a retry, as it was then; ids after it keep
    their kinds."""
    path = tmp_path / "c.db"
    async with Substrate(store=str(path), workflows=ENDLESS, compact_after=3) as sub:
        await sub.new_case("cart", {}, case_id="c")
        for i in range(5):
            await sub.signal("c", "add", i, request_id=f"s{i}")
        assert (await sub.journal("c"))[0].kind == "snapshot"
    with sqlite3.connect(path) as conn:  # as a wfsub that kept no kinds wrote them: a sorted list of ids
        for table, column in (("journal", "record"), ("snapshots", "state")):
            for key, text in conn.execute(f"SELECT seq, {column} FROM {table} WHERE case_id = 'c'").fetchall():
                value = json.loads(text)
                state = value.get("state") if table == "journal" else value
                if isinstance(state, dict) and isinstance(state.get("request_ids"), dict):
                    state["request_ids"] = sorted(state["request_ids"])
                    conn.execute(f"UPDATE {table} SET {column} = ? WHERE case_id = 'c' AND seq = ?",
                                 (json.dumps(value), key))
        old = [json.loads(t) for (t,) in conn.execute("SELECT record FROM journal WHERE kind = 'snapshot'")]
    assert isinstance(old[0]["state"]["request_ids"], list)
    kept = request_kinds_of([old[0]])
    assert kept and set(kept.values()) == {None}
    async with Substrate(store=str(path), workflows=ENDLESS, compact_after=None) as sub:
        unknown = next(iter(kept))
        await sub.cancel("c", request_id=unknown)  # of unknown kind: taken as a retry, not applied
        await sub.signal("c", "add", 5, request_id="s5")
        with pytest.raises(SignalRejected, match=_used_by("signal", "s5")):
            await sub.cancel("c", request_id="s5")
        await eventually(lambda: sub.data("c").get("n") == 6, BOUND)
        assert sub.status("c").state == CaseState.WAITING_SIGNAL
        assert "cancel" not in kinds(await sub.journal("c"))


def test_kinds_read_from_snapshots_old_and_new() -> None:
    """A snapshot's ids as a dict keep their kinds; as a list (older snapshots) each is of unknown kind, which
    `taken` matches with any kind; a known kind matches only itself."""
    assert kept_kinds({"request_ids": {"a": "signal", "b": "update"}}) == {"a": "signal", "b": "update"}
    assert kept_kinds({"request_ids": ["a", "b"]}) == {"a": None, "b": None}
    assert kept_kinds(None) == {}
    assert taken({"a": None}, "a", "cancel", "c", "cancel")
    assert taken({"a": "cancel"}, "a", "cancel", "c", "cancel")
    assert not taken({"a": "cancel"}, "b", "cancel", "c", "cancel")
    with pytest.raises(SignalRejected, match=r"case 'c' cannot cancel: " + _used_by("update", "a")):
        taken({"a": "update"}, "a", "cancel", "c", "cancel")

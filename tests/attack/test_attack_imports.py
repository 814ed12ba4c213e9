"""An attack on `import wfsub` loading its names on first use: star imports, first use from many threads, the app's
structlog before and after the import, type checkers reading the same names, and the public objects a program
hands to another process (pickled errors and statuses).

Each test pins either a fault the attack found (now fixed) or behaviour that held up.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import wfsub
from wfsub import CaseFailed, Substrate, seq, task, wait
from wfsub.stores import CommitUnknown, StoreConflict, StoreError

ROOT = Path(__file__).resolve().parents[2]  # the project's root


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (nothing of wfsub loaded yet)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


# -- what held ---------------------------------------------------------------------------------------------------


def test_first_use_from_many_threads_at_once_gives_every_thread_the_same_objects() -> None:
    """Sixteen threads' first use of every lazy name gets the same objects; `import *` binds __all__."""
    ran = _python("""
        import sys, threading
        import wfsub
        names = [*wfsub.__all__, "stores", "lowlevel", "testing", "runtime", "terms", "contrib"]
        seen, errors = [], []
        start = threading.Barrier(16)
        def use():
            start.wait()
            try:
                seen.append(tuple(id(getattr(wfsub, n)) for n in names))
            except BaseException as exc:
                errors.append(repr(exc))
        threads = [threading.Thread(target=use) for _ in range(16)]
        for t in threads: t.start()
        for t in threads: t.join()
        assert not errors, errors
        assert len(set(seen)) == 1, "threads got different objects"
        assert wfsub.Substrate is sys.modules["wfsub._runtime"].Substrate
        space = {}
        exec("from wfsub import *", space)
        assert set(wfsub.__all__) <= set(space), set(wfsub.__all__) - set(space)
        assert set(wfsub.__all__) <= set(dir(wfsub))
    """)
    assert ran.returncode == 0, ran.stderr


@pytest.mark.parametrize("configured", ["before", "after"])
def test_the_apps_structlog_gets_wfsubs_events_whether_configured_before_or_after_the_import(
    configured: str
) -> None:
    """A failed case's event reaches the app's structlog configured before or after `import wfsub`."""
    ran = _python(f"""
        import asyncio
        import structlog
        seen = []
        def keep(logger, method, event):
            seen.append(dict(event))
            raise structlog.DropEvent
        if {configured == "before"}:
            structlog.configure(processors=[keep])
        import wfsub
        if {configured == "after"}:
            structlog.configure(processors=[keep])
        def boom(ctx):
            raise ValueError("out of stock")
        async def main():
            async with wfsub.Substrate() as sub:
                handle = await sub.new_case(wfsub.task(boom), case_id="c1")
                try:
                    await handle.result()
                except wfsub.CaseFailed:
                    pass
        asyncio.run(main())
        failed = [e for e in seen if e.get("event") == "case failed"]
        assert failed and failed[0]["case_id"] == "c1" and "out of stock" in failed[0]["error"], seen
    """)
    assert ran.returncode == 0, ran.stderr


USER_SCRIPT = """
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import wfsub
from wfsub import CaseHandle, CaseState, CaseStatus, Substrate, compile, seq, task, to_mermaid, wait
from wfsub.lowlevel import Machine, check_input
from wfsub.stores import Store, open_store


def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"ok": True}


async def main() -> None:
    flow = seq(wait("go"), task(step))
    machine = Machine(compile(flow), {})
    text: str = to_mermaid(flow)
    store: Store = open_store("memory:")
    async with Substrate(store=store, workflows={"flow": flow}) as sub:
        handle: CaseHandle = await sub.new_case("flow")
        await handle.signal("go", {"x": 1})
        status: CaseStatus = handle.status()
        state: CaseState = status.state
        body: dict[str, Any] = check_input("signal", {"name": "go"})
        wrong: int = wfsub.Substrate
        print(machine, text, state, body, wrong)
"""


def test_mypy_strict_reads_the_lazy_names_as_their_real_types(tmp_path: Path) -> None:
    """mypy --strict on a user program sees the lazy names' real types (its one wrong line is caught)."""
    script = tmp_path / "app.py"
    script.write_text(USER_SCRIPT)
    # From the project's root with its cache: `make test` type-checks the package just before (the same options),
    # so wfsub and its dependencies are read from the cache rather than analysed again (a minute on two cores).
    ran = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(ROOT / ".mypy_cache"), str(script)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )
    errors = [line for line in ran.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "wrong: int = wfsub.Substrate" in USER_SCRIPT, ran.stdout + ran.stderr
    assert 'expression has type "type[Substrate]", variable has type "int"' in errors[0], ran.stdout


def _step(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"ok": True}


def _boom(ctx: Mapping[str, Any]) -> dict[str, Any]:
    raise ValueError("out of stock")


async def test_a_case_status_and_journal_survive_pickling() -> None:
    """A CaseStatus (failed, waiting) and a durable case's journal come back equal from pickle."""
    async with Substrate(store=wfsub.stores.MemoryStore(), workflows={"w": seq(wait("go"), task(_step)),
                                                                   "f": task(_boom)}) as sub:
        failed = await sub.new_case("f")
        with pytest.raises(CaseFailed):
            await failed.result()
        waiting = await sub.new_case("w")
        await waiting.signal("go", {"n": 1})
        await waiting.result()
        for status in (failed.status(), waiting.status()):
            assert pickle.loads(pickle.dumps(status)) == status
        journal = await sub.journal(waiting.case_id)
        assert pickle.loads(pickle.dumps(journal)) == journal


# -- faults ------------------------------------------------------------------------------------------------------


ERRORS = [
    wfsub.CaseCancelled("c1", "customer asked"),
    wfsub.CaseExists("c1"),
    wfsub.CaseFailed("c1", "seq[1].task", "task boom raised ValueError: out of stock"),
    wfsub.CaseNotFound("c1"),
    wfsub.CompensationFailed("saga", [{"path": "saga[0]", "type": "ValueError", "message": "no refund"}]),
    wfsub.LimitExceeded("mi", "more than 10 instances"),
    wfsub.ReplayDivergence("c1", 3, "effect", "charge", "ship", ("charge",)),
    wfsub.RestoredError("KeyError", "'sku'"),
    wfsub.SignalRejected("c1", "take signal 'go'", "it has already ended", path="seq"),
    wfsub.StepFailed("seq[0].task", "boom"),
    wfsub.SubstrateClosed("send a signal"),
    wfsub.WaitTimeout("seq[0].wait", "no 'go' within 5s"),
    wfsub.WorkflowNotRegistered("orders", ["billing"]),
    StoreError("cases.db", "the disk is full"),
    StoreConflict("cases.db", "another owner"),
    CommitUnknown("cases.db", "the answer was lost"),
    wfsub.InvalidWorkflow([wfsub.ValidationIssue(path="seq[0]", message="an empty seq")]),
    wfsub.InvalidStartData("orders", dict, [{"loc": ("sku",), "msg": "Field required"}], "c1"),
    wfsub.EffectResultError.not_json("charge", "seq[0].task", "a set"),
    wfsub.MachineStateError("no effect 7 is pending"),
    wfsub.SnapshotMismatch("another program"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_every_public_error_survives_pickling(error: Exception) -> None:
    """Every public error comes back from pickle of its type, with its message and fields."""
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and vars(back) == vars(error)

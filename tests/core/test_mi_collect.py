"""`collect` copies each mi instance's output when that instance's thread ends: work the instance left running
(a discriminator's loser, with its own steps and an mi's collect) writes on into the instance, never into the
collected list, in a live run, after a snapshot and restore, and in the reference interpreter alike."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

import wfsub
from wfsub import mi, par, seq, task, wait
from wfsub._terms import Term
from wfsub._vm._interp import _EMPTY_OUT
from wfsub.lowlevel import Machine

from .gen import Recorder
from .test_differential import VmSide, check_agreement


def put(key: str, value: Any) -> Term:
    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {key: value}

    step.__qualname__ = f"put_{key}"
    return task(step)


def nothing(ctx: Mapping[str, Any]) -> None:
    return None


def leftover(first: Term) -> Term:
    """Two instances, each done when `first` is; its loser waits for `go`, then writes `late` and `late_mi`."""
    loser = seq(wait("go"), put("late", 1), mi(put("inner", 2), count=1, collect="late_mi"))
    return seq(
        mi(par(first, loser, join="first"), count=2, collect="out", cancel_remaining=False),
        put("after", True),
    )


WROTE = leftover(put("early", 0))
SILENT = leftover(task(nothing))  # instances that return nothing: collected as the one shared empty output


def _to_signal(m: Machine) -> None:
    r = m.run(10**6)
    assert r.status == "blocked" and r.signals == ("go",), (r.status, r.signals)


def _finish(m: Machine) -> None:
    for _ in range(2):  # one loser per instance
        m.deliver_signal("go")
        r = m.run(10**6)
    assert r.status == "done", m.error_message


@pytest.mark.parametrize(("term", "collected"), [(WROTE, [{"early": 0}] * 2), (SILENT, [{}, {}])])
def test_leftover_work_does_not_write_into_the_collected_outputs(term: Term, collected: list[Any]) -> None:
    """Live, and restored from a snapshot taken after the join while the losers wait: the same collected list."""
    program = wfsub.compile(term)
    live = Machine(program)
    _to_signal(live)
    assert live.data == {"out": collected, "after": True}
    restored = Machine.restore(program, json.loads(json.dumps(live.snapshot())))
    _finish(live)
    _finish(restored)
    assert live.data == restored.data == {"out": collected, "after": True}


def test_an_empty_output_shared_by_instances_is_never_written() -> None:
    """Many instances that return nothing, each leaving a loser that writes later: every collected output stays {}."""
    term = seq(mi(par(task(nothing), seq(wait("go"), put("late", 1)), join="first"),
                  count=5, collect="out", cancel_remaining=False), mi(task(nothing), count=2, collect="again"))
    m = Machine(wfsub.compile(term))
    r = m.run(10**6)
    assert r.status == "blocked"
    for _ in range(5):
        m.deliver_signal("go")
        r = m.run(10**6)
    assert r.status == "done", m.error_message
    assert m.data == {"out": [{}] * 5, "again": [{}, {}]}
    assert _EMPTY_OUT == {}


@pytest.mark.parametrize("term", [WROTE, SILENT], ids=["wrote", "silent"])
@pytest.mark.parametrize("restore", [False, True], ids=["live", "restored"])
def test_collect_with_leftover_work_agrees_with_the_reference(term: Term, restore: bool) -> None:
    """The vm, restored before every input or not, gives the reference interpreter's data at every point."""

    def restored(vm: VmSide) -> None:
        if restore:
            vm.m = Machine.restore(vm.m.program, json.loads(json.dumps(vm.m.snapshot())))

    check_agreement(term, Recorder(), [("signal", "go", None)] * 2, 1, between=restored)

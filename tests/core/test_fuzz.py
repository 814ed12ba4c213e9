"""Random inputs against a workflow that nests nearly every construct, checked against the reference interpreter."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wfsub
from wfsub import (
    call,
    critical,
    defer,
    effect,
    interleave,
    loop,
    mi,
    milestone,
    par,
    scope,
    seq,
    sleep,
    task,
    terminate,
    wait,
    xor,
)
from wfsub._terms import Term
from wfsub.lowlevel import Machine, Seeded

from .gen import Recorder
from .test_differential import VmSide, _apply, check_agreement


async def work(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"e": 1}


def bump(key: str) -> Term:
    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {key: ctx.get(key, 0) + 1}

    step.__qualname__ = f"bump_{key}"
    return task(step)


LIBRARY = {
    "rec": xor(
        (
            lambda c: c.get("depth", 0) < 2,
            seq(bump("depth"), par(call("rec"), scope("rs", wait("z")), join="first")),
        ),
        default=bump("leaf"),
    )
}
WORKFLOW = seq(
    scope(
        "outer",
        par(
            interleave(
                critical("L", seq(bump("a"), effect(work))),
                par(wait("s1"), bump("b"), join="first"),
                scope("is", sleep(2)),
                order=[(0, 1)],
            ),
            mi(
                seq(interleave(bump("m1"), scope("ms", wait("s2"))), milestone("M", effect(work))),
                count=3, join=2, name="mm", collect="mo", cancel_remaining=False,
            ),
            loop(seq(critical("L", bump("c")), xor((lambda c: c.get("c", 0) > 5, terminate()), default=bump("w"))),
                 times=2),
            call("rec"),
            mi(scope("dyn_s", wait("s3")), count=1, dynamic=True, name="dyn", join="all"),
            defer({"s1": bump("d1"), "s2": bump("d2")}, timeout=3, on_timeout=bump("dt")),
            join=5,
        ),
        on_cancel=bump("oc"),
    ),
    bump("end"),
)
PROGRAM = wfsub.compile(WORKFLOW, library=LIBRARY)
REGIONS = sorted(PROGRAM.regions)


SIGNALS = ["s1", "s2", "s3", "z"]
ACTIONS = st.one_of(
    st.tuples(st.just("effect"), st.integers(0, 5), st.sampled_from(["ok", "ok", "ok", "error"])),
    st.tuples(st.just("timer"), st.integers(0, 5)),
    st.tuples(st.just("signal"), st.sampled_from(SIGNALS), st.integers(0, 9)),
    st.tuples(st.sampled_from(["cancel_region", "complete_region"]), st.sampled_from(REGIONS)),
    st.tuples(st.just("add_instances"), st.just("dyn"), st.lists(st.integers(0, 99), min_size=1, max_size=2)),
    st.tuples(st.just("close_instances"), st.just("dyn")),
    st.tuples(st.just("cancel"), st.booleans()),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, max_size=60), st.sampled_from([1, 3, 50]), st.randoms(use_true_random=False))
def test_random_inputs_agree_with_the_reference_and_restore_is_exact(
    script: list[tuple[Any, ...]], quanta: int, rnd: random.Random
) -> None:
    """Any input script gives the reference's state at every quiescent point, across JSON snapshot restores."""
    # Only SignalRejected may meet an input, and only where the reference refuses it too (check_agreement).

    def restore(vm: VmSide) -> None:
        if rnd.random() < 0.2:
            vm.m = Machine.restore(PROGRAM, json.loads(json.dumps(vm.m.snapshot())))

    check_agreement(WORKFLOW, Recorder(), script, quanta, LIBRARY, between=restore)


def _drive(vm: VmSide, action: tuple[Any, ...]) -> str | None:
    """Apply one input to a vm side (the effect or timer its number picks); the refusal's text, if refused."""
    effects, timers = sorted(vm.effects), sorted(vm.timers)
    effect_id = effects[action[1] % len(effects)] if action[0] == "effect" and effects else None
    timer_id = timers[action[1] % len(timers)] if action[0] == "timer" and timers else None
    if (action[0] == "effect" and effect_id is None) or (action[0] == "timer" and timer_id is None):
        return None
    if action[0] == "effect":
        vm.effects.pop(effect_id)  # type: ignore[arg-type]
    if action[0] == "timer":
        vm.timers.discard(timer_id)  # type: ignore[arg-type]
    try:
        _apply(vm.m, action, effect_id, timer_id)
    except wfsub.SignalRejected as refused:
        return str(refused)
    return None


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ACTIONS, max_size=40), st.integers(0, 2**32), st.randoms(use_true_random=False))
def test_a_seeded_machine_restored_at_random_points_matches_one_never_restored(
    script: list[tuple[Any, ...]], seed: int, rnd: random.Random
) -> None:
    """Under Seeded(seed) (which the reference does not follow), snapshots keep the scheduler's choices exactly."""
    kept, moved = VmSide(PROGRAM, 3), VmSide(PROGRAM, 3)
    kept.m, moved.m = Machine(PROGRAM, scheduler=Seeded(seed)), Machine(PROGRAM, scheduler=Seeded(seed))
    for action in [("start",), *script]:
        if action[0] != "start":
            if rnd.random() < 0.3:
                moved.m = Machine.restore(PROGRAM, json.loads(json.dumps(moved.m.snapshot())))
            assert _drive(moved, action) == _drive(kept, action), action
        kept.run()
        moved.run()
        assert (moved.status, moved.error, moved.signals) == (kept.status, kept.error, kept.signals), action
        assert (moved.m.data, moved.effects, moved.timers) == (kept.m.data, kept.effects, kept.timers), action
        if kept.status in ("done", "failed", "cancelled"):
            break

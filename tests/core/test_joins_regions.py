"""What a join waits for, MI partial joins, region steps inside a workflow, and regions made of several scopes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import wfsub
from wfsub import (
    add_instances,
    call,
    cancel_region,
    close_instances,
    complete_region,
    effect,
    interleave,
    mi,
    par,
    scope,
    seq,
    task,
    validate,
    wait,
)
from wfsub._terms import Term
from wfsub.lowlevel import Machine, RunResult


def mark(log: list[str], name: str) -> Term:
    def step(ctx: Mapping[str, Any]) -> None:
        log.append(name if "index" not in ctx else f"{name}{ctx['index']}")

    step.__qualname__ = name
    return task(step, name=name)


async def work(ctx: Mapping[str, Any]) -> None:
    return None


def run(m: Machine) -> RunResult:
    while (r := m.run(1000)).status == "yielded":
        pass
    return r


def machine(term: Term, data: dict[str, Any] | None = None, **kw: Any) -> Machine:
    return Machine(wfsub.compile(term, **kw), data)


# -- MI partial joins --------------------------------------------------------------------------------------


def test_an_n_join_fires_at_the_nth_completion_even_when_that_is_the_last_instance() -> None:
    """mi(join=3) over 3 instances fires exactly when the third completes, with all outputs collected."""
    log: list[str] = []
    m = machine(seq(mi(seq(wait("go"), mark(log, "i")), count=3, join=3, collect="outs"), mark(log, "after")))
    run(m)
    for expected in (["i0"], ["i0", "i1"]):
        m.deliver_signal("go")
        assert run(m).status == "blocked" and log == expected
    m.deliver_signal("go")
    assert run(m).status == "done" and log == ["i0", "i1", "i2", "after"]
    assert m.data["outs"] == [{"go": None}] * 3  # an instance's output: what its steps stored


def test_a_run_time_count_below_n_is_a_failure_at_the_mi() -> None:
    """count=lambda c: 1 with join=2 fails at the mi, as validate reports for count=1 (zero included)."""
    for count in (1, 0):
        m = machine(seq(mi(task(lambda c: None), count=lambda c, n=count: n, join=2), task(lambda c: None)))
        r = run(m)
        assert r.status == "failed" and r.error_path == "seq[0].mi"
        assert "needs at least 2 instances, but the count is" in (r.error_message or "")
    assert [i.path for i in validate(mi(task(lambda c: None), count=1, join=2))] == ["mi"]
    first = machine(mi(task(lambda c: None), count=lambda c: 0, join="first"))
    assert run(first).status == "failed"


def test_withdrawn_instances_that_make_n_unreachable_fire_the_join_with_what_completed() -> None:
    """Instances withdrawn until n is out of reach: the join fires once the rest ended, with what completed."""
    log: list[str] = []
    body = seq(scope("one", wait("go")), mark(log, "i"))
    m = machine(seq(mi(body, count=3, join=3, collect="outs", name="m"), mark(log, "after")))
    run(m)
    m.deliver_signal("go")  # instance 0 completes
    run(m)
    m.cancel_region("one")  # both remaining instances lose their scope: withdrawn
    r = run(m)
    assert r.status == "done" and log == ["i0", "after"]
    assert m.data["outs"] == [{"go": None}, None, None]


def test_an_mi_whose_every_instance_was_withdrawn_is_withdrawn() -> None:
    """With nothing completed and nothing able to, the mi (and here the case's root thread) is withdrawn."""
    m = machine(seq(mi(scope("s", wait("go")), count=2, join=2), task(lambda c: {"after": True})))
    run(m)
    m.cancel_region("s")
    assert run(m).status == "cancelled" and "after" not in m.data


def test_a_dynamic_mi_closed_below_n_fires_with_what_completed() -> None:
    """A dynamic mi with join=3 whose running instances all end below 3 fires its join with what completed."""
    # dynamic=True takes instances only while one runs: once none runs, join=3 is out of reach.
    log: list[str] = []
    m = machine(seq(mi(seq(wait("go"), mark(log, "i")), count=1, join=3, dynamic=True, name="d"), mark(log, "after")))
    run(m)
    m.add_instances("d", ["x"])
    run(m)
    m.deliver_signal("go")
    assert run(m).status == "blocked" and log == ["i0"]
    m.deliver_signal("go")
    assert run(m).status == "done" and log == ["i0", "i1", "after"]


def test_until_fires_the_join_early() -> None:
    """until(stats) checked at each completion fires a join before its policy would."""
    log: list[str] = []
    m = machine(seq(mi(seq(wait("go"), mark(log, "i")), count=4, until=lambda s: s.completed == 2), mark(log, "z")))
    run(m)
    m.deliver_signal("go")
    m.deliver_signal("go")
    assert run(m).status == "done" and log == ["i0", "i1", "z"]


# -- joins synchronize threads, not detached work ------------------------------------------------------------


def test_a_par_join_does_not_wait_for_the_instances_of_an_unsynchronized_mi() -> None:
    """A par join fires when a branch holding an mi(join=None) arrives; the case ends after the detached instance."""
    log: list[str] = []
    wf = seq(
        par(seq(mi(wait("x"), count=1, join=None), mark(log, "after_mi")), mark(log, "b")),
        mark(log, "joined"),
    )
    m = machine(wf)
    r = run(m)
    assert r.status == "blocked" and log == ["after_mi", "b", "joined"]
    m.deliver_signal("x")
    assert run(m).status == "done"


def test_a_later_join_does_not_wait_for_a_discriminators_losers() -> None:
    """WCP9 losers are not synchronized by an enclosing join; they still belong to the case."""
    log: list[str] = []
    inner = par(mark(log, "fast"), seq(wait("slow"), mark(log, "loser")), join="first")
    m = machine(seq(par(inner, mark(log, "other")), mark(log, "joined")))
    assert run(m).status == "blocked" and log == ["fast", "other", "joined"]
    m.deliver_signal("slow")
    assert run(m).status == "done" and log == ["fast", "other", "joined", "loser"]


def test_an_interleave_branch_waits_for_all_of_its_work() -> None:
    """Unlike a par join, an interleave branch ends only when the mi it started has ended too."""
    log: list[str] = []
    wf = interleave(seq(mi(wait("x"), count=1, join=None), mark(log, "a")), mark(log, "b"))
    m = machine(wf)
    assert run(m).status == "blocked" and log == ["a"]
    m.deliver_signal("x")
    assert run(m).status == "done" and log == ["a", "b"]


def test_cancel_remaining_also_withdraws_work_the_arrived_branch_left_behind() -> None:
    """A first join with cancel_remaining withdraws the losers and the detached work of the winner."""
    wf = seq(
        par(seq(mi(wait("x"), count=1, join=None), task(lambda c: None)), wait("slow"), join="first",
            cancel_remaining=True),
        task(lambda c: {"after": True}),
    )
    m = machine(wf)
    assert run(m).status == "done" and m.data == {"after": True}


def test_a_cancelled_region_withdraws_the_detached_work_inside_it() -> None:
    """Detached work still belongs to the regions around it: cancelling the region withdraws it."""
    wf = seq(scope("r", seq(mi(effect(work), count=2, join=None), task(lambda c: None))), wait("end"))
    m = machine(wf)
    r = run(m)
    assert len(r.effects) == 2
    m.cancel_region("r")
    assert len(run(m).cancelled_effects) == 2


# -- region steps ------------------------------------------------------------------------------------------------


def test_cancel_region_step_withdraws_a_live_region_and_passes_an_inactive_one() -> None:
    """A fraud check cancels shipping; a step on a region not yet entered or already ended does nothing."""
    log: list[str] = []
    wf = seq(
        cancel_region("ship"),  # not entered yet: traced, nothing happens
        par(scope("ship", seq(wait("shipped"), mark(log, "shipped"))), seq(mark(log, "fraud"), cancel_region("ship"))),
        cancel_region("ship"),  # ended: nothing happens
        mark(log, "end"),
    )
    m = Machine(wfsub.compile(wf), trace_level="min")
    assert run(m).status == "done" and log == ["fraud", "end"]
    kinds = [e.kind for e in m.take_events()]
    assert kinds.count("region_inactive") == 2 and kinds.count("region_cancelled") == 1


def test_a_step_inside_the_region_it_cancels_is_withdrawn_with_it() -> None:
    """cancel_region from inside the region ends that thread; on_cancel runs; the flow goes on after the scope."""
    log: list[str] = []
    wf = seq(scope("r", seq(cancel_region("r"), mark(log, "never")), on_cancel=mark(log, "oc")), mark(log, "after"))
    m = machine(wf)
    assert run(m).status == "done" and log == ["oc", "after"]


def test_complete_region_step_joins_an_mi_now() -> None:
    """complete_region from a parallel branch closes a running mi: it joins with the outputs so far."""
    wf = seq(
        par(mi(seq(wait("go"), task(lambda c: {"o": c["index"]})), count=3, name="m", collect="outs"),
            seq(wait("enough"), complete_region("m"))),
        task(lambda c: {"after": True}),
    )
    m = machine(wf)
    run(m)
    m.deliver_signal("go")
    run(m)
    m.deliver_signal("enough")
    assert run(m).status == "done" and m.data["outs"] == [{"go": None, "o": 0}, None, None] and m.data["after"]


def test_an_instance_that_completes_its_own_mi_counts_as_cancelled() -> None:
    """complete_region on the enclosing mi from inside an instance withdraws that instance too."""
    body = seq(wait("go"), complete_region("m"), task(lambda c: {"never": True}))
    m = Machine(wfsub.compile(seq(mi(body, count=2, name="m", collect="outs"), wait("end"))), trace_level="min")
    run(m)
    m.deliver_signal("go")
    run(m)
    joined = [e.detail for e in m.take_events() if e.kind == "mi_joined"]
    assert joined == [{"completed": 0, "cancelled": 2, "token": joined[0]["token"]}]
    assert m.data["outs"] == [None, None]


def test_complete_region_step_on_a_joined_mi_is_a_failure_at_the_step() -> None:
    """A refused region step (other than an inactive region) fails at the step, naming why."""
    wf = seq(mi(task(lambda c: None), count=1, join=None, name="m"), wait("x"), complete_region("m"))
    m = machine(seq(mi(seq(wait("x"), task(lambda c: None)), count=1, join=None, name="m"), complete_region("m")))
    r = run(m)
    assert r.status == "failed" and r.error_path == "seq[1].complete_region"
    assert "has no join" in (r.error_message or "")
    assert validate(wf) == []


def test_add_and_close_instances_steps_grow_and_close_a_dynamic_mi() -> None:
    """add_instances(items=fn) adds instances from inside the case; close_instances stops more being added."""
    wf = seq(
        par(
            mi(seq(wait("go"), task(lambda c: {"v": c["item"]})), items=lambda c: [1], dynamic="open", name="d",
               collect="outs"),
            seq(add_instances("d", items=lambda c: [2, 3]), close_instances("d")),
        ),
        task(lambda c: {"after": True}),
    )
    m = machine(wf)
    run(m)
    for _ in range(3):
        m.deliver_signal("go")
    assert run(m).status == "done"
    assert m.data["outs"] == [{"go": None, "v": 1}, {"go": None, "v": 2}, {"go": None, "v": 3}]


def test_region_steps_address_their_own_instance_when_the_region_is_in_the_same_mi_body() -> None:
    """A cancel_region step in an mi body cancels the region in its own instance only."""
    log: list[str] = []
    body = seq(
        par(scope("inner", seq(wait("go"), mark(log, "inner"))), seq(wait("stop"), cancel_region("inner"))),
        mark(log, "done"),
    )
    m = machine(mi(body, count=2))
    run(m)
    m.deliver_signal("stop")  # instance 0 cancels its own "inner"
    run(m)
    m.deliver_signal("go")  # the only "go" waiter left is instance 1's
    run(m)
    assert log == ["done0", "inner1"]


def test_region_steps_from_outside_the_mi_body_address_every_activation() -> None:
    """A step outside the mi body that declares a region reaches the region in every instance."""
    wf = par(mi(scope("inner", wait("go")), count=3), seq(wait("stop"), cancel_region("inner")))
    m = Machine(wfsub.compile(wf), trace_level="min")
    run(m)
    m.deliver_signal("stop")
    assert run(m).status == "done"  # every instance withdrawn (so the mi branch is); the other branch arrived
    assert [e.kind for e in m.take_events()].count("region_cancelled") == 3


def test_region_steps_are_validated_against_the_regions_the_workflow_declares() -> None:
    """An unknown region and add_instances on a scope or a static mi are reported at the step's path."""
    found = [(i.path, i.message) for i in validate(seq(
        scope("s", task(lambda c: None)),
        mi(task(lambda c: None), count=1, name="static"),
        cancel_region("nope"),
        add_instances("s", items=lambda c: []),
        close_instances("static"),
    ))]
    assert [path for path, _ in found] == ["seq[2].cancel_region", "seq[3].add_instances", "seq[4].close_instances"]
    assert "names no region of the workflow (regions: s, static)" in found[0][1]
    assert "region 's' is a scope at seq[0].scope" in found[1][1]


def test_a_region_step_in_a_library_workflow_may_address_the_callers_region() -> None:
    """A region step reaches regions of the workflows a case runs (the library included)."""
    lib = {"stop_shipping": cancel_region("ship")}
    m = machine(par(scope("ship", wait("shipped")), call("stop_shipping")), library=lib)
    assert run(m).status == "done" and m.live_regions() == []
    assert validate(cancel_region("ship")) != []


# -- a region made of several scopes -----------------------------------------------------------------------------


def test_scopes_sharing_a_name_form_one_region_cancelled_at_once() -> None:
    """Two scopes named 'r' in two par branches are cancelled together; a part that has ended is left alone."""
    log: list[str] = []
    wf = seq(
        par(
            scope("r", seq(wait("a"), mark(log, "a"))),
            scope("r", mark(log, "quick")),  # ends before the cancel
            scope("r", seq(wait("b"), mark(log, "b"))),
            seq(wait("stop"), cancel_region("r")),
        ),
        mark(log, "after"),
    )
    m = machine(wf)
    run(m)
    m.deliver_signal("stop")
    assert run(m).status == "done" and log == ["quick", "after"]


def test_an_mi_name_may_not_be_shared() -> None:
    """A scope and an mi, or two mi, with one name are a validation issue (add_instances must know which)."""
    issues = validate(seq(scope("r", task(lambda c: None)), mi(task(lambda c: None), count=1, name="r")))
    assert [i.path for i in issues] == ["seq[1].mi"] and "an mi's name must be its own" in issues[0].message


@pytest.mark.parametrize("op", ["cancel_region", "complete_region"])
def test_region_operations_on_a_shared_region_are_all_or_nothing(op: str) -> None:
    """complete_region refuses before touching any part; cancel_region touches every live part."""
    m = machine(par(scope("r", wait("a")), scope("r", wait("b")), mi(wait("c"), count=1, join=None, name="m")))
    run(m)
    getattr(m, op)("r")
    assert m.live_regions() == ["m"]

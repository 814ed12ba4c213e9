"""Multiple-instance patterns at the vm level: WCP12-15 (no sync, design-time, run-time and no a-priori
knowledge) and the MI partial joins WCP34-36."""

from __future__ import annotations

import pytest

from wfsub import SignalRejected, mi, seq

from ._drive import Case, call_task, fx, step

# -- WCP12 multiple instances without synchronization ----------------------------------------------


def test_wcp12_mi_without_synchronization_goes_on_at_once() -> None:
    """WCP12: with join=None the step after the mi runs before any instance completes; instance writes stay
    in the instances, and the case is done only once every instance has ended."""
    log: list[str] = []
    case = Case(seq(mi(fx("work"), count=3, join=None), step(log, "after")), {"n": 0})
    r = case.run()
    assert (r.status, log, case.pending_names()) == ("blocked", ["after"], ["work"] * 3)
    ids = case.effect_ids("work")
    for eid in ids[:2]:
        assert case.complete(eid, {"n": 99}).status == "blocked"
    assert case.complete(ids[2], {"n": 99}).status == "done"
    assert log == ["after"]
    assert case.data == {"n": 0}


# -- WCP13 multiple instances with design-time knowledge -------------------------------------------


def test_wcp13_design_time_count_runs_that_many_instances_and_collects_in_order() -> None:
    """WCP13: count=3 runs three instances; collect gives each instance's own output in instance order."""
    log: list[str] = []
    body = call_task(log, "square", lambda ctx: {"sq": ctx["index"] ** 2})
    case = Case(seq(mi(body, count=3, collect="out"), step(log, "after")))
    assert case.run().status == "done"
    assert log == ["square"] * 3 + ["after"]
    assert case.data == {"out": [{"sq": 0}, {"sq": 1}, {"sq": 4}]}


def test_wcp13_instance_outputs_stay_in_order_whatever_the_completion_order() -> None:
    """WCP13: instances completed in reverse order still collect in instance order."""
    case = Case(mi(fx("work"), count=3, collect="out"))
    case.run()
    ids = case.effect_ids("work")
    case.complete(ids[2], {"v": "c"})
    case.complete(ids[0], {"v": "a"})
    assert case.complete(ids[1], {"v": "b"}).status == "done"
    assert case.data == {"out": [{"v": "a"}, {"v": "b"}, {"v": "c"}]}


def test_wcp13_zero_instances_join_at_once_with_an_empty_collection() -> None:
    """WCP13 edge: count=0 is legal: the join fires at once and collect gives []."""
    log: list[str] = []
    case = Case(seq(mi(fx("work"), count=0, collect="out"), step(log, "after")))
    r = case.run()
    assert (r.status, r.effects, log, case.data) == ("done", [], ["after"], {"out": []})


# -- WCP14 multiple instances with run-time knowledge ----------------------------------------------


def test_wcp14_run_time_count_is_read_from_the_data_when_the_mi_starts() -> None:
    """WCP14: count=fn(ctx) is evaluated when the mi is reached, after earlier steps set the data."""
    log: list[str] = []
    term = seq(step(log, "plan", n=4), mi(fx("work"), count=lambda ctx: ctx["n"]))
    r = Case(term).run()
    assert [req.name for req in r.effects] == ["work"] * 4
    assert [req.ctx["index"] for req in r.effects] == [0, 1, 2, 3]


def test_wcp14_items_give_one_instance_per_item_that_sees_item_and_index() -> None:
    """WCP14: items=fn(ctx) starts one instance per item; the output is what the instance wrote, not item."""
    body = call_task([], "label", lambda ctx: {"label": f"{ctx['index']}:{ctx['item']}"})
    case = Case(mi(body, items=lambda ctx: ctx["xs"], collect="out"), {"xs": ["p", "q"]})
    assert case.run().status == "done"
    assert case.data["out"] == [{"label": "0:p"}, {"label": "1:q"}]


def test_wcp14_empty_items_join_at_once() -> None:
    """WCP14 edge: empty items are legal: the join fires at once and collect gives []."""
    log: list[str] = []
    case = Case(seq(mi(fx("work"), items=lambda ctx: [], collect="out"), step(log, "after")))
    assert (case.run().status, log, case.data["out"]) == ("done", ["after"], [])


def test_wcp14_run_time_count_outside_max_fails_the_case() -> None:
    """WCP14 edge: a run-time count above max= fails the case at the mi's path."""
    case = Case(seq(mi(fx("work"), count=lambda ctx: 5, max=3), fx("after")))
    r = case.run()
    assert (r.status, r.error_path, r.effects) == ("failed", "seq[0].mi", [])


# -- WCP15 multiple instances without a priori run-time knowledge ----------------------------------


def test_wcp15_instances_added_while_running_count_towards_the_join() -> None:
    """WCP15: add_instances on a running dynamic mi adds instances the join waits for and collects."""
    log: list[str] = []
    term = seq(
        mi(fx("work"), items=lambda ctx: ["a"], dynamic=True, name="m", collect="out"),
        step(log, "after"),
    )
    case = Case(term)
    case.run()
    case.m.add_instances("m", ["b", "c"])
    r = case.run()
    assert [(req.ctx["item"], req.ctx["index"]) for req in r.effects] == [("b", 1), ("c", 2)]
    ids = case.effect_ids("work")
    case.complete(ids[0], {"v": "a"})
    case.complete(ids[2], {"v": "c"})
    assert log == []
    case.m.add_instances("m", ["d"])
    case.run()
    case.complete(ids[1], {"v": "b"})
    assert log == []
    r = case.complete("work", {"v": "d"})
    assert (r.status, log) == ("done", ["after"])
    assert case.data["out"] == [{"v": "a"}, {"v": "b"}, {"v": "c"}, {"v": "d"}]


def test_wcp15_a_dynamic_mi_rejects_instances_once_its_join_fired() -> None:
    """WCP15 edge: once the join fired the mi is closed; add_instances is rejected."""
    case = Case(seq(mi(fx("work"), count=1, dynamic=True, name="m"), fx("after")))
    case.run()
    case.complete("work")
    with pytest.raises(SignalRejected):
        case.m.add_instances("m", ["late"])


def test_wcp15_close_instances_rejects_later_additions() -> None:
    """WCP15 edge: after close_instances no instance can be added."""
    case = Case(mi(fx("work"), count=1, dynamic=True, name="m"))
    case.run()
    case.m.close_instances("m")
    with pytest.raises(SignalRejected):
        case.m.add_instances("m", ["x"])
    assert case.complete("work").status == "done"


def test_wcp15_add_instances_on_a_static_mi_is_rejected() -> None:
    """WCP15 edge: only a dynamic mi takes instances."""
    case = Case(mi(fx("work"), count=1, name="m"))
    case.run()
    with pytest.raises(SignalRejected):
        case.m.add_instances("m", ["x"])


# -- WCP34 static partial join for multiple instances ----------------------------------------------


def test_wcp34_static_partial_join_fires_at_n_and_lets_the_rest_run_on_ignored() -> None:
    """WCP34: join=2 with cancel_remaining=False continues after the 2nd completion with the outputs so far
    (None for the rest); the rest run on, their outputs are ignored, and the case waits for them."""
    log: list[str] = []
    term = seq(mi(fx("work"), count=4, join=2, cancel_remaining=False, collect="out"), step(log, "after"))
    case = Case(term)
    case.run()
    ids = case.effect_ids("work")
    assert (case.complete(ids[3], {"v": 3}).status, log) == ("blocked", [])
    r = case.complete(ids[1], {"v": 1})
    assert (r.status, log, r.cancelled_effects) == ("blocked", ["after"], [])
    assert case.data["out"] == [None, {"v": 1}, None, {"v": 3}]
    case.complete(ids[0], {"v": 0})
    r = case.complete(ids[2], {"v": 2})
    assert (r.status, log, case.cancelled_effects) == ("done", ["after"], [])
    assert case.data["out"] == [None, {"v": 1}, None, {"v": 3}]


# -- WCP35 cancelling partial join for multiple instances ------------------------------------------


def test_wcp35_cancelling_partial_join_cancels_the_remaining_instances() -> None:
    """WCP35: join=2 with cancel_remaining=True withdraws the instances still running at the 2nd completion."""
    log: list[str] = []
    term = seq(mi(fx("work"), count=4, join=2, cancel_remaining=True, collect="out"), step(log, "after"))
    case = Case(term)
    case.run()
    ids = case.effect_ids("work")
    case.complete(ids[0], {"v": 0})
    r = case.complete(ids[2], {"v": 2})
    assert (r.status, log, sorted(r.cancelled_effects)) == ("done", ["after"], [ids[1], ids[3]])
    assert case.data["out"] == [{"v": 0}, None, {"v": 2}, None]
    assert case.m.complete_effect(ids[1], {"v": 1}) is False


# -- WCP36 dynamic partial join for multiple instances ---------------------------------------------


def test_wcp36_dynamic_partial_join_counts_added_instances_and_cancels_the_rest() -> None:
    """WCP36: a dynamic mi with join=2 fires at the 2nd completion among initial and added instances,
    cancels the rest, and then refuses more instances."""
    log: list[str] = []
    term = seq(mi(fx("work"), items=lambda ctx: ["a"], dynamic=True, join=2, name="m"), step(log, "after"))
    case = Case(term)
    case.run()
    case.m.add_instances("m", ["b", "c"])
    case.run()
    a, b, c = case.effect_ids("work")
    assert (case.complete(c).status, log) == ("blocked", [])
    r = case.complete(a)
    assert (r.status, log, r.cancelled_effects) == ("done", ["after"], [b])
    with pytest.raises(SignalRejected):
        case.m.add_instances("m", ["d"])


def test_wcp36_dynamic_partial_join_without_cancel_waits_for_the_rest() -> None:
    """WCP36: with cancel_remaining=False the dynamic partial join fires at n and the rest run on."""
    log: list[str] = []
    mi_term = mi(fx("work"), items=lambda ctx: ["a"], dynamic=True, join=1, cancel_remaining=False, name="m")
    case = Case(seq(mi_term, step(log, "after")))
    case.run()
    case.m.add_instances("m", ["b"])
    case.run()
    a, b = case.effect_ids("work")
    r = case.complete(b)
    assert (r.status, log) == ("blocked", ["after"])
    assert (case.complete(a).status, log) == ("done", ["after"])

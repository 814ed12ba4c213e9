"""Multiple-instance patterns at the vm level: WCP12-15 (no sync, design-time, run-time and no a-priori
knowledge) and the MI partial joins WCP34-36."""

from __future__ import annotations

import pytest

from wfsub import SignalRejected, mi, seq

from ..harness import Case, Recorder

# -- WCP12 multiple instances without synchronization ----------------------------------------------


def test_wcp12_mi_without_synchronization_goes_on_at_once() -> None:
    """WCP12: with join=None what follows runs at once; instance writes stay in them; the case ends with the last."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), count=3, join=None), rec.step("after")), {"n": 0})
    r = case.run()
    assert (r.status, rec.steps, case.pending_names()) == ("blocked", ["after"], ["work"] * 3)
    ids = case.effect_ids("work")
    for eid in ids[:2]:
        assert case.complete(eid, {"n": 99}).status == "blocked"
    assert case.complete(ids[2], {"n": 99}).status == "done"
    assert rec.steps == ["after"]
    assert case.data == {"n": 0}


# -- WCP13 multiple instances with design-time knowledge -------------------------------------------


def test_wcp13_design_time_count_runs_that_many_instances_and_collects_in_order() -> None:
    """WCP13: count=3 runs three instances; collect gives each instance's own output in instance order."""
    rec = Recorder()
    body = rec.step("square", lambda ctx: {"sq": ctx["index"] ** 2})
    case = Case(seq(mi(body, count=3, collect="out"), rec.step("after")))
    assert case.run().status == "done"
    assert rec.steps == ["square"] * 3 + ["after"]
    assert case.data == {"out": [{"sq": 0}, {"sq": 1}, {"sq": 4}]}


def test_wcp13_instance_outputs_stay_in_order_whatever_the_completion_order() -> None:
    """WCP13: instances completed in reverse order still collect in instance order."""
    rec = Recorder()
    case = Case(mi(rec.effect("work"), count=3, collect="out"))
    case.run()
    ids = case.effect_ids("work")
    case.complete(ids[2], {"v": "c"})
    case.complete(ids[0], {"v": "a"})
    assert case.complete(ids[1], {"v": "b"}).status == "done"
    assert case.data == {"out": [{"v": "a"}, {"v": "b"}, {"v": "c"}]}


def test_wcp13_zero_instances_join_at_once_with_an_empty_collection() -> None:
    """WCP13 edge: count=0 is legal: the join fires at once and collect gives []."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), count=0, collect="out"), rec.step("after")))
    r = case.run()
    assert (r.status, r.effects, rec.steps, case.data) == ("done", [], ["after"], {"out": []})


# -- WCP14 multiple instances with run-time knowledge ----------------------------------------------


def test_wcp14_run_time_count_is_read_from_the_data_when_the_mi_starts() -> None:
    """WCP14: count=fn(ctx) is evaluated when the mi is reached, after earlier steps set the data."""
    rec = Recorder()
    term = seq(rec.step("plan", {"n": 4}), mi(rec.effect("work"), count=lambda ctx: ctx["n"]))
    r = Case(term).run()
    assert (r.status, rec.steps) == ("blocked", ["plan"])
    assert [req.name for req in r.effects] == ["work"] * 4
    assert [req.ctx["index"] for req in r.effects] == [0, 1, 2, 3]


def test_wcp14_items_give_one_instance_per_item_that_sees_item_and_index() -> None:
    """WCP14: items=fn(ctx) starts one instance per item; the output is what the instance wrote, not item."""
    rec = Recorder()
    body = rec.step("label", lambda ctx: {"label": f"{ctx['index']}:{ctx['item']}"})
    case = Case(mi(body, items=lambda ctx: ctx["xs"], collect="out"), {"xs": ["p", "q"]})
    assert (case.run().status, rec.steps) == ("done", ["label", "label"])
    assert case.data == {"xs": ["p", "q"], "out": [{"label": "0:p"}, {"label": "1:q"}]}


def test_wcp14_empty_items_join_at_once() -> None:
    """WCP14 edge: empty items are legal: the join fires at once and collect gives []."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), items=lambda ctx: [], collect="out"), rec.step("after")))
    assert (case.run().status, rec.steps, case.data["out"]) == ("done", ["after"], [])


def test_wcp14_run_time_count_outside_max_fails_the_case() -> None:
    """WCP14 edge: a run-time count above max= fails the case at the mi's path."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), count=lambda ctx: 5, max=3), rec.effect("after")))
    r = case.run()
    assert (r.status, r.error_path, r.effects) == ("failed", "seq[0].mi", [])
    assert r.error_message is not None and "max=3" in r.error_message


# -- WCP15 multiple instances without a priori run-time knowledge ----------------------------------


def test_wcp15_instances_added_while_running_count_towards_the_join() -> None:
    """WCP15: add_instances on a running dynamic mi adds instances the join waits for and collects."""
    rec = Recorder()
    term = seq(
        mi(rec.effect("work"), items=lambda ctx: ["a"], dynamic=True, name="m", collect="out"),
        rec.step("after"),
    )
    case = Case(term)
    case.run()
    r = case.add_instances("m", ["b", "c"])
    assert [(req.ctx["item"], req.ctx["index"]) for req in r.effects] == [("b", 1), ("c", 2)]
    ids = case.effect_ids("work")
    case.complete(ids[0], {"v": "a"})
    case.complete(ids[2], {"v": "c"})
    assert rec.steps == []
    case.add_instances("m", ["d"])
    case.complete(ids[1], {"v": "b"})
    assert rec.steps == []
    r = case.complete("work", {"v": "d"})
    assert (r.status, rec.steps) == ("done", ["after"])
    assert case.data["out"] == [{"v": "a"}, {"v": "b"}, {"v": "c"}, {"v": "d"}]


def test_wcp15_a_dynamic_mi_rejects_instances_once_its_join_fired() -> None:
    """WCP15 edge: once the join fired the mi is closed; add_instances is rejected."""
    rec = Recorder()
    case = Case(seq(mi(rec.effect("work"), count=1, dynamic=True, name="m"), rec.effect("after")))
    case.run()
    case.complete("work")
    with pytest.raises(SignalRejected, match="'m' is not active"):
        case.add_instances("m", ["late"])
    assert case.pending_names() == ["after"]


def test_wcp15_close_instances_rejects_later_additions() -> None:
    """WCP15 edge: after close_instances no instance can be added."""
    rec = Recorder()
    case = Case(mi(rec.effect("work"), count=1, dynamic=True, name="m"))
    case.run()
    case.close_instances("m")
    with pytest.raises(SignalRejected, match="'m' is closed"):
        case.add_instances("m", ["x"])
    assert case.pending_names() == ["work"]
    assert case.complete("work").status == "done"


def test_wcp15_add_instances_on_a_static_mi_is_rejected() -> None:
    """WCP15 edge: only a dynamic mi takes instances."""
    rec = Recorder()
    case = Case(mi(rec.effect("work"), count=1, name="m"))
    case.run()
    with pytest.raises(SignalRejected, match="'m' is not dynamic"):
        case.add_instances("m", ["x"])
    assert case.pending_names() == ["work"]


# -- WCP34 static partial join for multiple instances ----------------------------------------------


def test_wcp34_static_partial_join_fires_at_n_and_lets_the_rest_run_on_ignored() -> None:
    """WCP34: join=2 without cancel goes on at the 2nd completion; the rest run on, awaited, their outputs ignored."""
    rec = Recorder()
    term = seq(mi(rec.effect("work"), count=4, join=2, cancel_remaining=False, collect="out"), rec.step("after"))
    case = Case(term)
    case.run()
    ids = case.effect_ids("work")
    assert (case.complete(ids[3], {"v": 3}).status, rec.steps) == ("blocked", [])
    r = case.complete(ids[1], {"v": 1})
    assert (r.status, rec.steps, r.cancelled_effects) == ("blocked", ["after"], [])
    assert case.data["out"] == [None, {"v": 1}, None, {"v": 3}]
    case.complete(ids[0], {"v": 0})
    r = case.complete(ids[2], {"v": 2})
    assert (r.status, rec.steps, case.cancelled_effects) == ("done", ["after"], [])
    assert case.data["out"] == [None, {"v": 1}, None, {"v": 3}]


# -- WCP35 cancelling partial join for multiple instances ------------------------------------------


def test_wcp35_cancelling_partial_join_cancels_the_remaining_instances() -> None:
    """WCP35: join=2 with cancel_remaining=True withdraws the instances still running at the 2nd completion."""
    rec = Recorder()
    term = seq(mi(rec.effect("work"), count=4, join=2, cancel_remaining=True, collect="out"), rec.step("after"))
    case = Case(term)
    case.run()
    ids = case.effect_ids("work")
    case.complete(ids[0], {"v": 0})
    r = case.complete(ids[2], {"v": 2})
    assert (r.status, rec.steps, sorted(r.cancelled_effects)) == ("done", ["after"], [ids[1], ids[3]])
    assert case.data["out"] == [{"v": 0}, None, {"v": 2}, None]
    assert case.m.complete_effect(ids[1], {"v": 1}) is False


# -- WCP36 dynamic partial join for multiple instances ---------------------------------------------


def test_wcp36_dynamic_partial_join_counts_added_instances_and_cancels_the_rest() -> None:
    """WCP36: a dynamic mi with join=2 fires at the 2nd completion counting added ones, cancels the rest, closes."""
    rec = Recorder()
    dynamic = mi(rec.effect("work"), items=lambda ctx: ["a"], dynamic=True, join=2, name="m")
    case = Case(seq(dynamic, rec.step("after"), rec.effect("hold")))
    case.run()
    case.add_instances("m", ["b", "c"])
    a, b, c = case.effect_ids("work")
    assert (case.complete(c).status, rec.steps) == ("blocked", [])
    r = case.complete(a)
    assert (r.status, rec.steps, r.cancelled_effects) == ("blocked", ["after"], [b])
    with pytest.raises(SignalRejected, match="'m' is not active"):
        case.add_instances("m", ["d"])
    assert case.pending_names() == ["hold"]


def test_wcp36_dynamic_partial_join_without_cancel_waits_for_the_rest() -> None:
    """WCP36: with cancel_remaining=False the dynamic partial join fires at n and the rest run on."""
    rec = Recorder()
    mi_term = mi(rec.effect("work"), items=lambda ctx: ["a"], dynamic=True, join=1, cancel_remaining=False, name="m")
    case = Case(seq(mi_term, rec.step("after")))
    case.run()
    case.add_instances("m", ["b"])
    a, b = case.effect_ids("work")
    r = case.complete(b)
    assert (r.status, rec.steps) == ("blocked", ["after"])
    assert (case.complete(a).status, rec.steps) == ("done", ["after"])

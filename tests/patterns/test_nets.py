"""Unstructured nets at the vm level: arbitrary cycles (WCP10), implicit termination inside a net (WCP11), the
generalised AND-join (WCP33) and the general synchronizing merge (WCP38), with what happens when a net cannot
move, fails, is withdrawn, runs inside an mi or a cancelled scope, and when a split finds no edge to take."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from wfsub import mi, net, par, saga, scope, seq, wait

from ..harness import Case, Recorder, trace_of


def below(key: str, n: int) -> Any:
    """A predicate: ctx[key] < n."""
    return lambda ctx: ctx.get(key, 0) < n


def count(rec: Recorder, name: str) -> Any:
    """A recorded step that counts its runs in data[name]."""
    return rec.step(name, lambda ctx: {name: ctx.get(name, 0) + 1})


# -- WCP10 arbitrary cycles ------------------------------------------------------------------------------------


def test_wcp10_a_cycle_with_two_entries_repeats_until_its_exit_condition() -> None:
    """WCP10: a loop entered at either of two nodes (not a block) goes round until its xor split exits."""
    rec = Recorder()
    term = net(
        {"a": count(rec, "a"), "b": count(rec, "b"), "c": count(rec, "c")},
        [
            ("start", "a", lambda ctx: ctx["enter"] == "a"),
            ("start", "b"),
            ("a", "b"),
            ("b", "c"),
            ("c", "a", below("c", 3)),
            ("c", "end"),
        ],
        split={"start": "xor", "c": "xor"},
    )
    case = Case(term, {"enter": "b"})
    assert case.run().status == "done"
    assert rec.steps == ["b", "c", "a", "b", "c", "a", "b", "c"]
    case = Case(term, {"enter": "a"})
    rec.steps.clear()
    assert case.run().status == "done"
    assert rec.steps == ["a", "b", "c", "a", "b", "c", "a", "b", "c"]


def test_wcp10_a_cycle_that_exits_on_its_first_pass_runs_each_node_once() -> None:
    """WCP10 edge: a back edge whose predicate fails at once is never taken: every node runs once."""
    rec = Recorder()
    term = seq(
        net(
            {"a": count(rec, "a"), "b": count(rec, "b")},
            [("start", "a"), ("a", "b"), ("b", "a", below("b", 1)), ("b", "end")],
            split={"b": "xor"},
        ),
        rec.step("after"),
    )
    case = Case(term)
    assert (case.run().status, rec.steps, case.data) == ("done", ["a", "b", "after"], {"a": 1, "b": 1})


def test_wcp10_a_cycle_around_an_effect_waits_for_each_round() -> None:
    """WCP10: a node of the cycle that parks on an effect holds the loop until the effect completes."""
    rec = Recorder()
    term = net(
        {"poll": rec.effect("poll"), "check": count(rec, "check")},
        [("start", "poll"), ("poll", "check"), ("check", "poll", below("check", 2)), ("check", "end")],
        split={"check": "xor"},
    )
    case = Case(term)
    case.run()
    assert case.complete("poll").status == "blocked"
    assert case.complete("poll").status == "done"
    assert rec.steps == ["check", "check"]


# -- WCP33 generalised AND-join --------------------------------------------------------------------------------


def test_wcp33_and_join_keeps_surplus_tokens_for_a_later_firing() -> None:
    """WCP33: two tokens on one edge before the other gets any: one firing per set; the surplus waits for later."""
    rec = Recorder()
    term = net(
        {
            "a": count(rec, "a"),
            "b": seq(wait("go"), count(rec, "b")),
            "j": count(rec, "j"),
        },
        [
            ("start", "a"),
            ("start", "b"),
            ("a", "a", below("a", 2)),
            ("a", "j"),
            ("b", "j"),
            ("b", "b", below("b", 2)),
            ("j", "end"),
        ],
        split={"a": "or", "b": "or"},
        join={"j": "and"},
    )
    case = Case(term, trace_level="min")
    assert case.run().status == "blocked"
    assert rec.steps == ["a", "a"]  # two tokens wait on the edge from a; none from b yet
    assert case.signal("go").status == "blocked"
    assert rec.steps == ["a", "a", "b", "j"]  # one set: one firing; the surplus token from a stays
    assert case.signal("go").status == "done"
    assert rec.steps == ["a", "a", "b", "j", "b", "j"]  # the second token from b finds it waiting
    fired = trace_of(case.events, "net_join")
    assert [(path, d["edges"]) for _, path, d in fired] == [("net[j].task", ["a", "b"])] * 2
    assert trace_of(case.events, "net_discarded") == []


def test_wcp33_and_join_tokens_left_when_the_net_cannot_move_are_discarded() -> None:
    """WCP33 edge: and-join tokens left when nothing can move are discarded (traced); a token at end: done."""
    rec = Recorder()
    term = seq(
        net(
            {"a": count(rec, "a"), "b": count(rec, "b"), "c": count(rec, "c"), "j": count(rec, "j")},
            [
                ("start", "a"),
                ("start", "b"),
                ("a", "j"),
                ("b", "c", lambda ctx: False),
                ("b", "end"),
                ("c", "j"),
                ("j", "end"),
            ],
            split={"b": "xor"},
            join={"j": "and"},
        ),
        rec.step("after"),
    )
    case = Case(term, trace_level="min")
    assert case.run().status == "done"
    assert rec.steps == ["a", "b", "after"]
    assert trace_of(case.events, "net_discarded") == [
        ("net_discarded", "seq[0].net[j].task", {"node": "j", "tokens": {"a": 1}})
    ]


# -- WCP38 general synchronizing merge -------------------------------------------------------------------------


def _or_merge(rec: Recorder) -> Any:
    return net(
        {
            "s": count(rec, "s"),
            "x": rec.effect("x"),
            "y": rec.effect("y"),
            "j": count(rec, "j"),
        },
        [
            ("start", "s"),
            ("s", "x", lambda ctx: ctx["want_x"]),
            ("s", "y", lambda ctx: ctx["want_y"]),
            ("s", "j"),
            ("x", "j"),
            ("y", "j"),
            ("j", "end"),
        ],
        split={"s": "or"},
        join={"j": "or"},
    )


def test_wcp38_or_join_whose_branches_are_all_skipped_fires_with_the_one_token() -> None:
    """WCP38: when the or split skips every optional branch, the or-join fires at once on the direct edge's token."""
    rec = Recorder()
    case = Case(_or_merge(rec), {"want_x": False, "want_y": False}, trace_level="min")
    assert (case.run().status, rec.steps) == ("done", ["s", "j"])
    assert [d["edges"] for _, _, d in trace_of(case.events, "net_join")] == [["s"]]


def test_wcp38_or_join_waits_for_a_token_that_can_still_arrive() -> None:
    """WCP38: the or-join holds the direct token while a chosen branch can still deliver; it fires once, with both."""
    rec = Recorder()
    case = Case(_or_merge(rec), {"want_x": True, "want_y": False}, trace_level="min")
    r = case.run()
    assert (r.status, case.pending_names(), rec.steps) == ("blocked", ["x"], ["s"])
    assert (case.complete("x").status, rec.steps) == ("done", ["s", "j"])
    assert [d["edges"] for _, _, d in trace_of(case.events, "net_join")] == [["s", "x"]]


def test_wcp38_or_join_fires_when_nothing_upstream_can_reach_its_empty_edge() -> None:
    """WCP38: the or-join fires while work that cannot reach its empty edge still runs; the net waits for it."""
    rec = Recorder()
    term = seq(
        net(
            {
                "s": count(rec, "s"),
                "x": count(rec, "x"),
                "y": count(rec, "y"),
                "z": count(rec, "z"),
                "w": rec.effect("w"),
                "j": count(rec, "j"),
            },
            [
                ("start", "x"),
                ("start", "s"),
                ("start", "w"),
                ("s", "y", lambda ctx: False),
                ("s", "z"),
                ("x", "j"),
                ("y", "j"),
                ("z", "end"),
                ("w", "end"),
                ("j", "end"),
            ],
            split={"s": "xor"},
            join={"j": "or"},
        ),
        rec.step("after"),
    )
    case = Case(term)
    r = case.run()
    assert (r.status, case.pending_names()) == ("blocked", ["w"])
    assert Counter(rec.steps) == Counter(["x", "s", "z", "j"])  # j did not wait for w: w cannot reach it
    assert (case.complete("w").status, rec.steps[-1]) == ("done", "after")


def test_wcp38_or_join_counts_a_token_inside_a_compound_node_as_upstream() -> None:
    """WCP38: an upstream par node holds its token until its thread leaves; the or-join waits for its last branch."""
    rec = Recorder()
    term = net(
        {"x": count(rec, "x"), "p": par(rec.step("p1"), rec.effect("p2")), "j": count(rec, "j")},
        [("start", "x"), ("start", "p"), ("x", "j"), ("p", "j"), ("j", "end")],
        join={"j": "or"},
    )
    case = Case(term)
    assert (case.run().status, rec.steps) == ("blocked", ["x", "p1"])
    assert (case.complete("p2").status, rec.steps) == ("done", ["x", "p1", "j"])


def test_wcp38_a_withdrawn_upstream_branch_never_blocks_the_or_join() -> None:
    """WCP38: once the upstream node it waits for is withdrawn, the or-join fires with what arrived."""
    rec = Recorder()
    term = seq(
        net(
            {"p": scope("s", rec.effect("p")), "x": count(rec, "x"), "j": count(rec, "j")},
            [("start", "p"), ("start", "x"), ("p", "j"), ("x", "j"), ("j", "end")],
            join={"j": "or"},
        ),
        rec.step("after"),
    )
    case = Case(term)
    assert (case.run().status, rec.steps) == ("blocked", ["x"])
    assert (case.cancel_region("s").status, rec.steps) == ("done", ["x", "j", "after"])


def test_wcp38_or_joins_waiting_on_each_other_fire_oldest_token_first() -> None:
    """WCP38 edge: two or-joins waiting on each other: when nothing else can move, the older token's join fires."""
    rec = Recorder()
    term = net(
        {"a": count(rec, "a"), "b": count(rec, "b"), "j": count(rec, "j"), "k": count(rec, "k")},
        [
            ("start", "a"),
            ("start", "b"),
            ("a", "j"),
            ("b", "k"),
            ("j", "k", below("j", 1)),
            ("j", "end"),
            ("k", "j", below("k", 1)),
            ("k", "end"),
        ],
        split={"j": "xor", "k": "xor"},
        join={"j": "or", "k": "or"},
    )
    case = Case(term, trace_level="min")
    assert case.run().status == "done"
    fired = [(d["node"], d.get("reason")) for _, _, d in trace_of(case.events, "net_join")]
    assert fired[0] == ("j", "nothing else in the net can move")  # a's token reached j before b's reached k
    assert rec.steps[:3] == ["a", "b", "j"]


# -- WCP11 implicit termination inside a net -------------------------------------------------------------------


def test_wcp11_a_net_ends_when_nothing_in_it_is_left_to_do() -> None:
    """WCP11: a token at end does not end the net while a branch still runs; its thread goes on once, at the end."""
    rec = Recorder()
    term = seq(
        net(
            {"a": count(rec, "a"), "b": rec.effect("b"), "c": count(rec, "c")},
            [("start", "a"), ("start", "b"), ("a", "end"), ("b", "c"), ("c", "end")],
        ),
        rec.step("after"),
    )
    case = Case(term, trace_level="min")
    assert (case.run().status, rec.steps) == ("blocked", ["a"])
    assert (case.complete("b").status, rec.steps) == ("done", ["a", "c", "after"])
    assert [d["from"] for _, _, d in trace_of(case.events, "net_end")] == ["a", "c"]


# -- when the net cannot finish ---------------------------------------------------------------------------------


def test_a_net_that_cannot_reach_end_fails_naming_the_waiting_joins() -> None:
    """A net stuck with tokens only at an and-join fails at the net, naming the join, what it holds and lacks."""
    rec = Recorder()
    term = seq(
        rec.step("before"),
        net(
            {"s": count(rec, "s"), "a": count(rec, "a"), "c": count(rec, "c"), "j": count(rec, "j")},
            [
                ("start", "s"),
                ("s", "a"),
                ("s", "c", lambda ctx: False),
                ("a", "j"),
                ("c", "j"),
                ("j", "end"),
            ],
            split={"s": "or"},
            join={"j": "and"},
        ),
    )
    case = Case(term)
    r = case.run()
    assert (r.status, r.error_path) == ("failed", "seq[1].net")
    assert r.error_message is not None
    assert "the and-join 'j' (holding 1 token from 'a'; nothing from 'c')" in r.error_message
    assert rec.steps == ["before", "s", "a"]


def test_a_net_whose_tokens_were_all_withdrawn_is_withdrawn() -> None:
    """A net whose threads were all withdrawn is itself withdrawn: the par around it joins with its other branch."""
    rec = Recorder()
    term = seq(
        par(
            net(
                {"a": scope("inner", rec.effect("a")), "b": count(rec, "b")},
                [("start", "a"), ("a", "b"), ("b", "end")],
            ),
            rec.effect("other"),
        ),
        rec.step("joined"),
    )
    case = Case(term, trace_level="min")
    case.run()
    a = case.effect_id("a")
    r = case.cancel_region("inner")
    assert (r.status, r.cancelled_effects, rec.steps) == ("blocked", [a], [])
    assert (case.complete("other").status, rec.steps) == ("done", ["joined"])
    assert ("withdrawn", "seq[0].par[0].net") in [(k, p) for k, p, _ in trace_of(case.events, "withdrawn")]


# -- nets inside other constructs -------------------------------------------------------------------------------


def test_a_net_inside_an_mi_has_one_activation_per_instance() -> None:
    """Each mi instance runs its own activation of the net: an or-join waits only for its own instance's token."""
    rec = Recorder()
    body = net(
        {"x": count(rec, "x"), "y": rec.effect("y"), "j": rec.step("j", lambda ctx: {"done": ctx["index"]})},
        [("start", "x"), ("start", "y"), ("x", "j"), ("y", "j"), ("j", "end")],
        join={"j": "or"},
    )
    case = Case(mi(body, count=3, collect="outs"))
    case.run()
    first, second, third = case.effect_ids("y")
    case.m.complete_effect(second, None)
    assert (case.run().status, rec.steps.count("j")) == ("blocked", 1)
    case.m.complete_effect(third, None)
    case.m.complete_effect(first, None)
    assert case.run().status == "done"
    assert rec.steps.count("j") == 3
    assert [out["done"] for out in case.data["outs"]] == [0, 1, 2]


def test_a_net_in_a_cancelled_scope_withdraws_its_tokens_and_compensates_its_sagas() -> None:
    """A scope cancelled around a net withdraws its tokens, compensates a node's saga, runs on_cancel, goes on."""
    rec = Recorder()
    term = seq(
        scope(
            "region",
            net(
                {
                    "pay": saga((rec.step("charge"), rec.step("refund")), rec.effect("ship")),
                    "watch": rec.effect("watch"),
                    "j": rec.step("j"),
                },
                [("start", "pay"), ("start", "watch"), ("pay", "j"), ("watch", "j"), ("j", "end")],
                join={"j": "or"},
            ),
            on_cancel=rec.step("on_cancel"),
        ),
        rec.step("after"),
    )
    case = Case(term)
    case.run()
    ship, watch = case.effect_id("ship"), case.effect_id("watch")
    r = case.cancel_region("region")
    assert (r.status, sorted(r.cancelled_effects)) == ("done", sorted([ship, watch]))
    assert rec.steps == ["charge", "refund", "on_cancel", "after"]


def test_blocking_joins_inside_a_net_hold_per_net_activation() -> None:
    """A blocking par inside a net holds per net activation: two activations of one inner net both split at once."""
    rec = Recorder()
    inner = net({"p": par(wait("a"), wait("b"), join="first", blocking=True)}, [("start", "p"), ("p", "end")])
    term = net(
        {"x": rec.step("x"), "y": rec.step("y"), "n": inner},
        [("start", "x"), ("start", "y"), ("x", "n"), ("y", "n"), ("n", "end")],
    )
    case = Case(term, trace_level="min")
    assert case.run().status == "blocked"
    assert len(trace_of(case.events, "split")) == 2
    assert trace_of(case.events, "par_blocked") == []


def test_net_joins_wait_for_threads_not_for_work_a_node_left_running() -> None:
    """Net joins wait for threads, not for a node's mi(join=None) instances, which the case still waits for."""
    rec = Recorder()
    term = seq(
        net(
            {"fan": mi(rec.effect("bg"), count=2, join=None), "x": rec.step("x"), "j": rec.step("j")},
            [("start", "fan"), ("start", "x"), ("fan", "j"), ("x", "j"), ("j", "end")],
            join={"j": "or"},
        ),
        rec.step("after"),
    )
    case = Case(term)
    r = case.run()
    assert (r.status, rec.steps, case.pending_names()) == ("blocked", ["x", "j", "after"], ["bg", "bg"])
    first, second = case.effect_ids("bg")
    case.complete(first)
    assert case.complete(second).status == "done"


def test_a_scope_cancelled_inside_a_node_runs_on_cancel_and_the_node_goes_on() -> None:
    """A scope cancelled inside a node runs its on_cancel and the node's thread goes on along its edges."""
    rec = Recorder()
    term = net(
        {"a": scope("inner", rec.effect("a"), on_cancel=rec.step("undo")), "b": rec.step("b")},
        [("start", "a"), ("a", "b"), ("b", "end")],
    )
    case = Case(term)
    case.run()
    assert (case.cancel_region("inner").status, rec.steps) == ("done", ["undo", "b"])


# -- splits that find no edge ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["xor", "or"])
def test_an_xor_split_with_no_true_predicate_is_a_failure_at_the_node_caught_by_on_error(kind: str) -> None:
    """An xor/or split where no edge predicate holds fails at the node; scope(on_error=) around the net catches it."""
    rec = Recorder()
    term = seq(
        scope(
            "guard",
            net(
                {"a": count(rec, "a"), "b": count(rec, "b"), "slow": rec.effect("slow")},
                [
                    ("start", "a"),
                    ("start", "slow"),
                    ("a", "b", lambda ctx: False),
                    ("a", "end", lambda ctx: False),
                    ("b", "end"),
                    ("slow", "end"),
                ],
                split={"a": kind},
            ),
            on_error=rec.step("handled"),
        ),
        rec.step("after"),
    )
    case = Case(term)
    r = case.run()
    assert (r.status, rec.steps, case.pending_names()) == ("done", ["a", "handled", "after"], [])  # slow withdrawn
    error = case.data["error"]
    assert (error["type"], error["path"]) == ("StepFailed", "seq[0].scope.net[a].task")
    assert f"no edge out of 'a' can be taken: it is an {kind} split" in error["message"]


def test_an_or_split_with_no_true_predicate_fails_the_case_at_the_node() -> None:
    """An or split where no predicate holds is a failure at the node (uncaught: the case fails there)."""
    rec = Recorder()
    term = net(
        {"a": count(rec, "a"), "b": count(rec, "b")},
        [("start", "a"), ("a", "b", lambda ctx: False), ("a", "end", lambda ctx: False), ("b", "end")],
        split={"a": "or"},
    )
    r = Case(term).run()
    assert (r.status, r.error_path) == ("failed", "net[a].task")
    assert r.error_message is not None and "it is an or split" in r.error_message


# -- tracing -------------------------------------------------------------------------------------------------------


def test_min_trace_records_node_starts_join_firings_and_discards_with_node_paths() -> None:
    """At level min a net records each node start (path net[name].kind), each join firing and each discard."""
    rec = Recorder()
    term = net(
        {"review": rec.step("review"), "audit": rec.step("audit"), "merge": rec.step("merge")},
        [("start", "review"), ("start", "audit"), ("review", "merge"), ("audit", "merge"), ("merge", "end")],
        join={"merge": "and"},
    )
    case = Case(term, trace_level="min")
    case.run()
    kinds = ("net_node", "net_join", "net_discarded", "net_end")
    assert [(k, p) for k, p, _ in trace_of(case.events, *kinds)] == [
        ("net_node", "net[review].task"),
        ("net_node", "net[audit].task"),
        ("net_join", "net[merge].task"),
        ("net_node", "net[merge].task"),
        ("net_end", "net"),
    ]

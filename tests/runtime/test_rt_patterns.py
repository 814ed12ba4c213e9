"""Every workflow pattern of the docs' pattern table (docs/guide/algebra.md), end to end through the public API
on a virtual clock."""

from __future__ import annotations

import pytest

from wfsub import (
    CaseCancelled,
    Term,
    call,
    critical,
    defer,
    interleave,
    loop,
    mi,
    milestone,
    multi_choice,
    par,
    scope,
    seq,
    sleep,
    terminate,
    wait,
    when_milestone,
    xor,
)
from wfsub.testing import CapturingSink

from ..harness import Recorder, running, trace_of


def effect_id(sink: CapturingSink, case_id: str, name: str) -> int:
    """The id the vm gave the one effect request named `name` in the case's trace."""
    (eid,) = [d["effect_id"] for _, _, d in trace_of(sink.for_case(case_id), "effect_requested") if d["name"] == name]
    return int(eid)


def sleeps_by_index(*seconds: float) -> Term:
    """Instance i of an mi sleeps seconds[i] (the last value for every later instance)."""
    firsts = [(lambda c, i=i: c["index"] == i, sleep(s)) for i, s in enumerate(seconds[:-1])]
    return xor(*firsts, default=sleep(seconds[-1]))


async def test_wcp1_sequence() -> None:
    """WCP1: steps run one after another, each seeing what the previous one wrote."""
    rec = Recorder()
    wf = seq(
        rec.step("a", {"a": 1}),
        rec.effect("charge", {"b": 2}),
        rec.step("c", lambda c: {"c": c["a"] + c["b"]}),
    )
    async with running() as (sub, _, _):
        assert await (await sub.new_case(wf)).result() == {"a": 1, "b": 2, "c": 3}
    assert (rec.steps, rec.calls) == (["a", "c"], ["charge"])


async def test_wcp2_wcp3_parallel_split_and_synchronization() -> None:
    """WCP2/3: branches run concurrently and the join waits for all of them."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(
            par(rec.effect("a", {"a": 1}, delay=1), rec.effect("b", {"b": 2}, delay=5)),
            rec.step("sum", lambda c: {"sum": c["a"] + c["b"]}),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        status = handle.status()
        assert (status.state, status.effects_pending) == ("waiting_effect", 1)
        assert (sorted(rec.calls), rec.max_active, rec.steps) == (["a", "b"], 2, [])
        await clock.advance(4)
        assert await handle.result() == {"a": 1, "b": 2, "sum": 3}
    assert rec.steps == ["sum"]


def _routing(rec: Recorder) -> Term:
    return seq(
        xor(
            (lambda c: c["amount"] > 100, rec.step("manual", {"route": "manual"})),
            (lambda c: c["amount"] > 10, rec.step("auto", {"route": "auto"})),
            default=rec.step("free", {"route": "free"}),
        ),
        rec.step("after"),
    )


async def test_wcp4_wcp5_exclusive_choice_and_simple_merge() -> None:
    """WCP4/5: exactly one branch runs (the first whose predicate holds), then the thread continues once."""
    async with running() as (sub, _, _):
        for amount, route in ((500, "manual"), (50, "auto"), (5, "free")):
            rec = Recorder()
            result = await (await sub.new_case(_routing(rec), {"amount": amount})).result()
            assert (result, rec.steps) == ({"amount": amount, "route": route}, [route, "after"])


async def test_wcp6_wcp7_wcp37_multi_choice_and_synchronizing_merge() -> None:
    """WCP6/7/37: every branch whose predicate holds runs; the merge waits for exactly those, once."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(
            multi_choice(
                (lambda c: c["email"], rec.effect("email", {"emailed": True}, delay=2)),
                (lambda c: c["sms"], rec.effect("sms", {"texted": True}, delay=1)),
                (lambda c: c["post"], rec.effect("post", {"posted": True})),
            ),
            rec.step("merged"),
        )
        handle = await sub.new_case(wf, {"email": True, "sms": True, "post": False})
        await clock.advance(1)
        status = handle.status()
        assert (status.state, status.effects_pending, rec.steps) == ("waiting_effect", 1, [])
        await clock.advance(1)
        result = await handle.result()
    assert sorted(rec.calls) == ["email", "sms"]
    assert rec.steps == ["merged"]
    assert result == {"email": True, "sms": True, "post": False, "emailed": True, "texted": True}


async def test_wcp8_multi_merge() -> None:
    """WCP8: with join="each" what follows runs once per arriving branch, as each arrives."""
    rec = Recorder()
    wf = seq(par(rec.step("a"), rec.step("b"), rec.step("c"), join="each"), rec.step("after"))
    async with running() as (sub, _, _):
        assert await (await sub.new_case(wf)).result() == {}
    assert rec.steps == ["a", "after", "b", "after", "c", "after"]


async def test_wcp9_discriminator_waits_for_the_rest_without_cancelling() -> None:
    """WCP9: the first branch fires the join once; the others run on and the case ends after them."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(
            par(rec.effect("fast", delay=1), rec.effect("slow", delay=10), join="first"),
            rec.step("after"),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        status = handle.status()
        assert (status.state, status.effects_pending, rec.steps) == ("waiting_effect", 1, ["after"])
        await clock.advance(9)
        result = await handle.result()
        ended_at = handle.status().ended_at
    assert result == {"fast": True, "slow": True}
    assert (rec.steps, rec.cancelled, ended_at) == (["after"], [], 10.0)


async def test_wcp29_cancelling_discriminator() -> None:
    """WCP29: the first branch fires the join; the in-flight loser is cancelled (traced at its path) and withdrawn."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        wf = seq(
            par(rec.effect("fast", delay=1), rec.effect("stuck", hang=True), join="first", cancel_remaining=True),
            rec.step("after"),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        result = await handle.result()
        await sink.wait_for("case_done", case_id=handle.case_id)
    assert result == {"fast": True}
    assert (rec.steps, rec.cancelled) == (["after"], ["stuck"])
    stuck = effect_id(sink, handle.case_id, "stuck")
    assert trace_of(sink.for_case(handle.case_id), "effect_cancelled", "withdrawn") == [
        ("effect_cancelled", "seq[0].par[1].effect", {"effect_id": stuck}),
        ("withdrawn", "seq[0].par", {"branches": 1, "reason": "join fired"}),
    ]


async def test_wcp30_structured_partial_join() -> None:
    """WCP30: the join fires after n of m branches; the rest run on and their arrival is ignored."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        wf = seq(par(*(rec.effect(f"b{i}", delay=i + 1) for i in range(3)), join=2), rec.step("after"))
        handle = await sub.new_case(wf)
        await clock.advance(2)
        assert (handle.status().effects_pending, rec.steps) == (1, ["after"])
        await clock.advance(1)
        result = await handle.result()
        await sink.wait_for("case_done", case_id=handle.case_id)
    assert result == {"b0": True, "b1": True, "b2": True}
    assert (rec.steps, rec.cancelled) == (["after"], [])
    joins = trace_of(sink.for_case(handle.case_id), "join", "join_late")
    assert [(kind, path) for kind, path, _ in joins] == [("join", "seq[0].par"), ("join_late", "seq[0].par")]


async def test_wcp32_cancelling_partial_join() -> None:
    """WCP32: n of m arrive, the join fires and the remaining branch's effect is cancelled."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        wf = seq(
            par(rec.effect("a", delay=1), rec.effect("b", delay=2), rec.effect("c", hang=True),
                join=2, cancel_remaining=True),
            rec.step("after"),
        )
        handle = await sub.new_case(wf)
        await clock.advance(2)
        result = await handle.result()
        await sink.wait_for("case_done", case_id=handle.case_id)
    assert result == {"a": True, "b": True}
    assert (rec.steps, rec.cancelled) == (["after"], ["c"])
    c = effect_id(sink, handle.case_id, "c")
    assert trace_of(sink.for_case(handle.case_id), "effect_cancelled") == [
        ("effect_cancelled", "seq[0].par[2].effect", {"effect_id": c})
    ]


async def test_wcp12_wcp42_mi_without_synchronization() -> None:
    """WCP12/42: instances start as separate threads; what follows runs before any ends; their writes stay in them."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(mi(rec.effect("ship", delay=5), count=3, join=None), rec.step("next", {"next_step": True}))
        handle = await sub.new_case(wf)
        await clock.advance(1)
        assert (handle.status().effects_pending, rec.steps) == (3, ["next"])
        await clock.advance(4)
        result = await handle.result()
    assert result == {"next_step": True}
    assert rec.calls == ["ship"] * 3


async def test_wcp13_wcp41_mi_design_time_knowledge_and_merge() -> None:
    """WCP13/41: a fixed number of instances, joined into one thread; collect keeps instance order."""
    rec = Recorder()
    wf = seq(mi(rec.effect("work", lambda c: {"square": c["index"] ** 2}), count=4, collect="out"), rec.step("after"))
    async with running() as (sub, _, _):
        result = await (await sub.new_case(wf)).result()
    assert result == {"out": [{"square": 0}, {"square": 1}, {"square": 4}, {"square": 9}]}
    assert (rec.calls, rec.steps) == (["work"] * 4, ["after"])


async def test_wcp14_mi_runtime_knowledge() -> None:
    """WCP14: the number of instances (or the items) is read from the case data when the mi starts."""
    rec = Recorder()
    wf = seq(
        mi(rec.step("count", lambda c: {"i": c["index"]}), count=lambda c: c["n"], collect="counted"),
        mi(rec.effect("check", lambda c: {"ok": c["item"].upper()}), items=lambda c: c["names"], collect="checked"),
    )
    async with running() as (sub, _, _):
        result = await (await sub.new_case(wf, {"n": 2, "names": ["x", "y", "z"]})).result()
    assert result == {
        "n": 2,
        "names": ["x", "y", "z"],
        "counted": [{"i": 0}, {"i": 1}],
        "checked": [{"ok": "X"}, {"ok": "Y"}, {"ok": "Z"}],
    }
    assert (rec.steps, rec.calls) == (["count"] * 2, ["check"] * 3)


async def test_wcp15_mi_without_a_priori_knowledge() -> None:
    """WCP15: instances added while the dynamic mi runs count towards its join."""
    rec = Recorder()
    wf = seq(
        mi(seq(sleep(1), rec.step("line", lambda c: {"v": c["item"] * 10})), items=lambda c: [1, 2], dynamic=True,
           name="lines", collect="out"),
        rec.step("after"),
    )
    async with running() as (sub, clock, _):
        handle = await sub.new_case(wf)
        await clock.advance(0)
        assert handle.status().regions == ("lines",)
        await sub.add_instances(handle.case_id, "lines", [3])
        await clock.advance(1)
        result = await handle.result()
    assert result == {"out": [{"v": 10}, {"v": 20}, {"v": 30}]}
    assert rec.steps == ["line"] * 3 + ["after"]


async def test_wcp34_wcp35_mi_partial_joins() -> None:
    """WCP34/35: an mi joins after n instances; static lets the rest run (awaited, ignored), cancelling withdraws it."""
    async with running() as (sub, clock, _):

        def review(rec: Recorder, cancel: bool) -> Term:
            # instances 0 and 1 end at t=2 and t=3 (the join fires), instance 2 is still asleep until t=5
            body = seq(sleeps_by_index(1, 2, 5), rec.step("prep", lambda c: {"d": c["index"] + 1}),
                       rec.effect("review", delay=1))
            return seq(mi(body, count=3, join=2, cancel_remaining=cancel, collect="out"), rec.step("after"))

        static_rec, cancelling_rec = Recorder(clock), Recorder(clock)
        static = await sub.new_case(review(static_rec, False))
        cancelling = await sub.new_case(review(cancelling_rec, True))
        await clock.advance(3)
        assert (static_rec.steps, cancelling_rec.steps) == (["prep", "prep", "after"], ["prep", "prep", "after"])
        assert await cancelling.result() == {"out": [{"d": 1, "review": True}, {"d": 2, "review": True}, None]}
        assert static.status().state == "waiting_timer"
        await clock.advance(3)
        assert await static.result() == {"out": [{"d": 1, "review": True}, {"d": 2, "review": True}, None]}
        assert static.status().ended_at == 6.0
    assert (static_rec.steps, static_rec.calls) == (["prep", "prep", "after", "prep"], ["review"] * 3)
    assert (cancelling_rec.calls, cancelling_rec.cancelled) == (["review"] * 2, [])


async def test_wcp36_mi_dynamic_partial_join() -> None:
    """WCP36: a dynamic mi's `until` counts added instances; the mi joins once it holds and cancels the rest."""
    rec = Recorder()
    wf = seq(
        # instance i finishes at t=i+1: the third completion (t=3) is that of the first added instance
        mi(seq(sleeps_by_index(1, 2, 3, 4), rec.step("bid", {"done": True})), count=2, dynamic=True, name="bids",
           until=lambda stats: stats.completed >= 3, collect="out"),
        rec.step("after"),
    )
    async with running() as (sub, clock, _):
        handle = await sub.new_case(wf)
        await clock.advance(0)
        await sub.add_instances(handle.case_id, "bids", ["late", "later"])
        await clock.advance(3)
        result = await handle.result()
    assert result == {"out": [{"done": True}, {"done": True}, {"done": True}, None]}
    assert rec.steps == ["bid"] * 3 + ["after"]


async def test_wcp26_cancel_mi_activity() -> None:
    """WCP26: cancelling a named mi withdraws every instance and its in-flight effects; the join goes on."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(par(mi(rec.effect("check", hang=True), count=3, name="checks"), rec.step("other", {"other": True})),
                 rec.step("after", {"after": True}))
        handle = await sub.new_case(wf)
        await clock.advance(0)
        assert handle.status().effects_pending == 3
        await sub.cancel_region(handle.case_id, "checks")
        result = await handle.result()
        alone = await sub.new_case(mi(rec.effect("solo", hang=True), count=2, name="checks"))
        await clock.advance(0)
        await sub.cancel_region(alone.case_id, "checks")
        with pytest.raises(CaseCancelled, match="withdrawn"):
            await alone.result()
    assert result == {"other": True, "after": True}
    assert rec.steps == ["other", "after"]
    assert rec.cancelled == ["check"] * 3 + ["solo"] * 2


async def test_wcp27_complete_mi_activity() -> None:
    """WCP27: completing a named mi cancels the rest and joins with the outputs so far."""
    rec = Recorder()
    async with running() as (sub, clock, _):
        wf = seq(
            mi(seq(sleeps_by_index(1, 2, 3), rec.step("line", lambda c: {"v": c["index"]})), count=3, name="lines",
               collect="out"),
            rec.step("after"),
        )
        handle = await sub.new_case(wf)
        await clock.advance(2)
        await sub.complete_region(handle.case_id, "lines")
        result = await handle.result()
    assert result == {"out": [{"v": 0}, {"v": 1}, None]}
    assert rec.steps == ["line", "line", "after"]


async def test_wcp16_deferred_choice_by_signal_and_by_timeout() -> None:
    """WCP16: the first signal (or the timeout) picks the branch; the others are withdrawn."""
    rec = Recorder()
    wf = defer(
        {"approve": rec.step("approved", {"outcome": "approved"}), "reject": rec.step("rejected")},
        timeout=60,
        on_timeout=rec.step("expired", {"outcome": "expired"}),
    )
    async with running() as (sub, clock, _):
        approved = await sub.new_case(wf)
        expired = await sub.new_case(wf)
        await sub.signal(approved.case_id, "approve", {"by": "ann"})
        await clock.advance(60)
        assert await approved.result() == {"outcome": "approved", "approve": {"by": "ann"}}
        assert await expired.result() == {"outcome": "expired"}
    assert sorted(rec.steps) == ["approved", "expired"]


async def test_wcp40_interleaved_routing() -> None:
    """WCP40: every branch runs exactly once, in any order, and never two at a time."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = interleave(*(rec.effect(n, delay=1) for n in ("a", "b", "c")))
        handle = await sub.new_case(wf)
        await clock.advance(3)
        assert await handle.result() == {"a": True, "b": True, "c": True}
    assert sorted(rec.calls) == ["a", "b", "c"]
    assert rec.max_active == 1


async def test_wcp17_interleaved_parallel_routing_with_a_partial_order() -> None:
    """WCP17: `order` pairs force some branches before others, still one at a time."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = interleave(
            rec.effect("pack", delay=1),
            rec.effect("invoice", delay=1),
            rec.effect("pick", delay=1),
            order=[("pick", "pack"), ("pack", "invoice")],
        )
        handle = await sub.new_case(wf)
        await clock.advance(3)
        await handle.result()
    assert rec.calls == ["pick", "pack", "invoice"]
    assert rec.max_active == 1


async def test_wcp18_milestone() -> None:
    """WCP18: a branch may run only while the milestone is reached; once it has passed it is withdrawn."""
    rec = Recorder()

    def flow() -> Term:
        return par(
            milestone("shipped", wait("delivered")),
            seq(wait("change"), when_milestone("shipped", rec.step("changed", {"changed": True}))),
        )

    async with running() as (sub, clock, sink):
        inside = await sub.new_case(flow())
        await sub.signal(inside.case_id, "change")
        await clock.advance(0)  # the change is handled while the milestone holds
        await sub.signal(inside.case_id, "delivered")
        assert await inside.result() == {"change": None, "changed": True, "delivered": None}
        assert rec.steps == ["changed"]

        late = await sub.new_case(flow())
        await sub.signal(late.case_id, "delivered")
        await clock.advance(0)
        await sub.signal(late.case_id, "change")
        assert await late.result() == {"delivered": None, "change": None}
        await sink.wait_for("case_done", case_id=late.case_id)
    assert rec.steps == ["changed"]
    assert trace_of(sink.for_case(late.case_id), "withdrawn") == [
        ("withdrawn", "par[1].seq[1].when_milestone", {"reason": "milestone 'shipped' has passed"})
    ]


async def test_wcp19_wcp25_cancel_task_and_region() -> None:
    """WCP19/25: cancelling a scope cancels the effect and the timer inside; on_cancel lets the thread continue."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        wf = seq(
            scope("checks", par(rec.effect("credit", hang=True), seq(sleep(5), rec.step("slow", {"slow": True}))),
                  on_cancel=rec.step("skipped", {"checks": "skipped"})),
            rec.step("after", {"after": True}),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        await sub.cancel_region(handle.case_id, "checks")
        await clock.advance(10)
        result = await handle.result()
        await sink.wait_for("case_done", case_id=handle.case_id)
    assert result == {"checks": "skipped", "after": True}
    assert (rec.steps, rec.cancelled) == (["skipped", "after"], ["credit"])
    events = sink.for_case(handle.case_id)
    credit = effect_id(sink, handle.case_id, "credit")
    ((_, _, armed),) = trace_of(events, "timer_armed")
    assert sorted(trace_of(events, "effect_cancelled", "timer_cancelled"), key=repr) == [
        ("effect_cancelled", "seq[0].scope.par[0].effect", {"effect_id": credit}),
        ("timer_cancelled", "seq[0].scope.par[1].seq[0].sleep", {"timer_id": armed["timer_id"]}),
    ]


async def test_wcp21_structured_loops() -> None:
    """WCP21: while_, until and times loops, with an effect in the body called once per iteration."""
    recs = [Recorder() for _ in range(3)]

    def bump(rec: Recorder) -> Term:
        return rec.effect("bump", lambda c: {"n": c["n"] + 1})

    async with running() as (sub, _, _):
        w = await sub.new_case(loop(bump(recs[0]), while_=lambda c: c["n"] < 3), {"n": 0})
        u = await sub.new_case(loop(bump(recs[1]), until=lambda c: c["n"] >= 5), {"n": 0})
        t = await sub.new_case(loop(bump(recs[2]), times=4), {"n": 0})
        assert [await h.result() for h in (w, u, t)] == [{"n": 3}, {"n": 5}, {"n": 4}]
    assert [rec.calls for rec in recs] == [["bump"] * 3, ["bump"] * 5, ["bump"] * 4]


async def test_wcp22_recursion_through_the_library() -> None:
    """WCP22: call(name) runs a library workflow, recursively."""
    rec = Recorder()
    countdown = seq(
        rec.step("dec", lambda c: {"n": c["n"] - 1, "trail": [*c["trail"], c["n"]]}),
        xor((lambda c: c["n"] > 0, call("countdown")), default=rec.step("landed", {"landed": True})),
    )
    async with running(library={"countdown": countdown}) as (sub, _, _):
        result = await (await sub.new_case(call("countdown"), {"n": 3, "trail": []})).result()
    assert result == {"n": 0, "trail": [3, 2, 1], "landed": True}
    assert rec.steps == ["dec"] * 3 + ["landed"]


async def test_wcp23_transient_trigger_is_dropped_when_nobody_waits() -> None:
    """WCP23: a transient signal sent before anyone waits is lost; one sent while waiting is taken."""
    wf = seq(sleep(1), wait("ping", transient=True))
    async with running() as (sub, clock, sink):
        handle = await sub.new_case(wf)
        await sub.signal(handle.case_id, "ping", "early")
        await clock.advance(1)
        assert handle.status().signals == ("ping",)
        await sub.signal(handle.case_id, "ping", "on time")
        assert await handle.result() == {"ping": "on time"}
        await sink.wait_for("case_done", case_id=handle.case_id)
    signals = trace_of(sink.for_case(handle.case_id), "signal_dropped", "signal_waiting", "signal_consumed")
    assert [(kind, detail["signal"]) for kind, _, detail in signals] == [
        ("signal_dropped", "ping"),
        ("signal_waiting", "ping"),
        ("signal_consumed", "ping"),
    ]


async def test_wcp24_persistent_trigger_is_buffered() -> None:
    """WCP24: a signal sent before anyone waits is kept (FIFO per name) until a wait takes it."""
    wf = seq(sleep(1), wait("ping", into="first"), wait("ping", into="second"))
    async with running() as (sub, clock, _):
        handle = await sub.new_case(wf)
        await sub.signal(handle.case_id, "ping", 1)
        await sub.signal(handle.case_id, "ping", 2)
        await clock.advance(1)
        result = await handle.result()
    assert result == {"first": 1, "second": 2}


async def test_wcp39_critical_section() -> None:
    """WCP39: critical sections of one case with the same name never overlap; others run alongside."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = par(
            critical("ledger", rec.effect("debit", delay=1)),
            critical("ledger", rec.effect("credit", delay=1)),
            rec.effect("notify", delay=1),
        )
        handle = await sub.new_case(wf)
        await clock.advance(0)
        assert (handle.status().effects_pending, sorted(rec.calls)) == (2, ["debit", "notify"])
        await clock.advance(1)  # debit done: credit may enter the section only now
        assert (handle.status().effects_pending, rec.calls[2:]) == (1, ["credit"])
        await clock.advance(1)
        assert await handle.result() == {"debit": True, "credit": True, "notify": True}
    assert rec.max_active == 2


async def test_wcp43_explicit_termination() -> None:
    """WCP43: terminate() cancels all remaining work and the case ends as done."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        wf = par(
            rec.effect("watch", hang=True),
            seq(sleep(1), rec.step("stop", {"stop": True}), terminate()),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        result = await handle.result()
        await sink.wait_for("case_done", case_id=handle.case_id)
    assert result == {"stop": True}
    assert (rec.steps, rec.cancelled) == (["stop"], ["watch"])
    watch = effect_id(sink, handle.case_id, "watch")
    assert trace_of(sink.for_case(handle.case_id), "terminated", "effect_cancelled", "case_done") == [
        ("terminated", "par[1].seq[2].terminate", {}),
        ("effect_cancelled", "par[0].effect", {"effect_id": watch}),
        ("case_done", "par", {}),
    ]

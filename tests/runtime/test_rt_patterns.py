"""Every workflow pattern of the DESIGN table, end to end through the public API on a virtual clock."""

from __future__ import annotations

from typing import Any

import pytest

from wfsub import (
    CaseCancelled,
    call,
    critical,
    defer,
    effect,
    interleave,
    loop,
    mi,
    milestone,
    multi_choice,
    par,
    scope,
    seq,
    sleep,
    task,
    terminate,
    wait,
    when_milestone,
    xor,
)

from ._helpers import Recorder, running


def put(**updates: Any) -> Any:
    return task(lambda ctx: dict(updates))


def count(key: str) -> Any:
    return task(lambda ctx: {key: ctx.get(key, 0) + 1}, name=f"count_{key}")


async def test_wcp1_sequence() -> None:
    """WCP1: steps run one after another, each seeing what the previous one wrote."""
    rec = Recorder()
    wf = seq(put(a=1), effect(rec.effect("charge", {"b": 2})), task(lambda c: {"c": c["a"] + c["b"]}))
    async with running() as (sub, _, _):
        assert await (await sub.new_case(wf)).result() == {"a": 1, "b": 2, "c": 3}
    assert rec.calls == ["charge"]


async def test_wcp2_wcp3_parallel_split_and_synchronization() -> None:
    """WCP2/3: branches run concurrently and the join waits for all of them."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(
            par(effect(rec.effect("a", {"a": 1}, delay=1)), effect(rec.effect("b", {"b": 2}, delay=5))),
            task(lambda c: {"sum": c["a"] + c["b"]}),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        assert handle.status().state == "waiting_effect"
        assert rec.max_active == 2
        await clock.advance(4)
        assert await handle.result() == {"a": 1, "b": 2, "sum": 3}


async def test_wcp4_wcp5_exclusive_choice_and_simple_merge() -> None:
    """WCP4/5: exactly one branch runs, then the thread continues once."""
    wf = seq(
        xor(
            (lambda c: c["amount"] > 100, put(route="manual")),
            (lambda c: c["amount"] > 10, put(route="auto")),
            default=put(route="free"),
        ),
        count("after"),
    )
    async with running() as (sub, _, _):
        results = [await (await sub.new_case(wf, {"amount": n})).result() for n in (500, 50, 5)]
    assert [(r["route"], r["after"]) for r in results] == [("manual", 1), ("auto", 1), ("free", 1)]


async def test_wcp6_wcp7_wcp37_multi_choice_and_synchronizing_merge() -> None:
    """WCP6/7/37: every branch whose predicate holds runs; the merge waits for exactly those, once."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(
            multi_choice(
                (lambda c: c["email"], effect(rec.effect("email", delay=2))),
                (lambda c: c["sms"], effect(rec.effect("sms", delay=1))),
                (lambda c: c["post"], effect(rec.effect("post"))),
            ),
            count("merged"),
        )
        handle = await sub.new_case(wf, {"email": True, "sms": True, "post": False})
        await clock.advance(1)
        assert handle.status().state == "waiting_effect"
        await clock.advance(1)
        result = await handle.result()
    assert sorted(rec.calls) == ["email", "sms"]
    assert result["merged"] == 1


async def test_wcp8_multi_merge() -> None:
    """WCP8: with join="each" what follows runs once per arriving branch."""
    wf = seq(par(put(a=1), put(b=1), put(c=1), join="each"), count("after"))
    async with running() as (sub, _, _):
        result = await (await sub.new_case(wf)).result()
    assert result["after"] == 3


async def test_wcp9_discriminator_waits_for_the_rest_without_cancelling() -> None:
    """WCP9: the first branch fires the join once; the others run on and the case ends after them."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(
            par(effect(rec.effect("fast", delay=1)), effect(rec.effect("slow", delay=10)), join="first"),
            count("after"),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        status = handle.status()
        assert status.state == "waiting_effect"
        assert status.effects_pending == 1
        await clock.advance(9)
        result = await handle.result()
    assert result["after"] == 1
    assert rec.cancelled == []


async def test_wcp29_cancelling_discriminator() -> None:
    """WCP29: the first branch fires the join and the in-flight others are cancelled."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        wf = seq(
            par(effect(rec.effect("fast", delay=1)), effect(rec.effect("stuck", hang=True)), join="first",
                cancel_remaining=True),
            count("after"),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        result = await handle.result()
    assert result["after"] == 1
    assert rec.cancelled == ["stuck"]
    assert "effect_cancelled" in sink.kinds(handle.case_id) or "withdrawn" in sink.kinds(handle.case_id)


async def test_wcp30_structured_partial_join() -> None:
    """WCP30: the join fires after n of m branches; the rest run on and are ignored."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(
            par(*(effect(rec.effect(f"b{i}", delay=i + 1)) for i in range(3)), join=2),
            count("after"),
        )
        handle = await sub.new_case(wf)
        await clock.advance(2)
        assert handle.status().effects_pending == 1
        await clock.advance(1)
        result = await handle.result()
    assert result["after"] == 1
    assert result["b2"] is True


async def test_wcp32_cancelling_partial_join() -> None:
    """WCP32: n of m arrive, the join fires and the remaining branches are cancelled."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(
            par(effect(rec.effect("a", delay=1)), effect(rec.effect("b", delay=2)), effect(rec.effect("c", hang=True)),
                join=2, cancel_remaining=True),
            count("after"),
        )
        handle = await sub.new_case(wf)
        await clock.advance(2)
        result = await handle.result()
    assert result["after"] == 1
    assert "c" not in result
    assert rec.cancelled == ["c"]


async def test_wcp12_wcp42_mi_without_synchronization() -> None:
    """WCP12/42: instances start as separate threads and what follows starts at once."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(mi(effect(rec.effect("ship", delay=5)), count=3, join=None), put(next_step=True))
        handle = await sub.new_case(wf)
        await clock.advance(1)
        status = handle.status()
        assert status.effects_pending == 3
        assert status.steps > 0
        await clock.advance(4)
        result = await handle.result()
    assert result["next_step"] is True
    assert rec.calls == ["ship"] * 3


async def test_wcp13_wcp41_mi_design_time_knowledge_and_merge() -> None:
    """WCP13/41: a fixed number of instances, joined into one thread; collect keeps instance order."""
    async def work(ctx: Any) -> dict[str, Any]:
        return {"square": ctx["index"] ** 2}

    wf = seq(mi(effect(work), count=4, collect="out"), count("after"))
    async with running() as (sub, _, _):
        result = await (await sub.new_case(wf)).result()
    assert result["out"] == [{"square": 0}, {"square": 1}, {"square": 4}, {"square": 9}]
    assert result["after"] == 1


async def test_wcp14_mi_runtime_knowledge() -> None:
    """WCP14: the number of instances (or the items) is read from the case data when the mi starts."""
    async def check(ctx: Any) -> dict[str, Any]:
        return {"ok": ctx["item"].upper()}

    wf = seq(
        mi(task(lambda c: {"i": c["index"]}), count=lambda c: c["n"], collect="counted"),
        mi(effect(check), items=lambda c: c["names"], collect="checked"),
    )
    async with running() as (sub, _, _):
        result = await (await sub.new_case(wf, {"n": 2, "names": ["x", "y", "z"]})).result()
    assert result["counted"] == [{"i": 0}, {"i": 1}]
    assert result["checked"] == [{"ok": "X"}, {"ok": "Y"}, {"ok": "Z"}]


async def test_wcp15_mi_without_a_priori_knowledge() -> None:
    """WCP15: instances added while the dynamic mi runs count towards its join."""
    wf = seq(
        mi(seq(sleep(1), task(lambda c: {"v": c["item"] * 10})), items=lambda c: [1, 2], dynamic=True,
           name="lines", collect="out"),
        count("after"),
    )
    async with running() as (sub, clock, _):
        handle = await sub.new_case(wf)
        await clock.advance(0)
        assert handle.status().regions == ("lines",)
        await sub.add_instances(handle.case_id, "lines", [3])
        await clock.advance(1)
        result = await handle.result()
    assert result["out"] == [{"v": 10}, {"v": 20}, {"v": 30}]
    assert result["after"] == 1


async def test_wcp34_wcp35_mi_partial_joins() -> None:
    """WCP34/35: an mi joins after n instances; static keeps the rest running, cancelling withdraws them."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)

        def build(cancel: bool) -> Any:
            body = seq(task(lambda c: {"d": c["index"] + 1}), effect(rec.effect("review", delay=1)))
            return seq(mi(seq(sleep_by_index(), body), count=3, join=2, cancel_remaining=cancel, collect="out"),
                       count("after"))

        static = await sub.new_case(build(False))
        cancelling = await sub.new_case(build(True))
        await clock.advance(10)
        static_result = await static.result()
        cancelling_result = await cancelling.result()
    assert static_result["after"] == 1
    assert cancelling_result["after"] == 1
    assert [o is not None for o in cancelling_result["out"]] == [True, True, False]


def sleep_by_index() -> Any:
    """Instance i sleeps i+1 seconds (0-based index), so instances finish in order."""
    return xor(
        (lambda c: c["index"] == 0, sleep(1)),
        (lambda c: c["index"] == 1, sleep(2)),
        default=sleep(3),
    )


async def test_wcp36_mi_dynamic_partial_join() -> None:
    """WCP36: a dynamic mi with a completion condition joins when the condition holds."""
    wf = seq(
        mi(seq(sleep(1), put(done=True)), count=2, dynamic=True, name="bids",
           until=lambda stats: stats.completed >= 3, collect="out"),
        count("after"),
    )
    async with running() as (sub, clock, _):
        handle = await sub.new_case(wf)
        await clock.advance(0)
        await sub.add_instances(handle.case_id, "bids", ["late", "later"])
        await clock.advance(1)
        result = await handle.result()
    assert result["after"] == 1
    assert sum(1 for o in result["out"] if o is not None) >= 3


async def test_wcp26_cancel_mi_activity() -> None:
    """WCP26: cancelling a named mi withdraws every instance and its in-flight effects; the join goes on."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(par(mi(effect(rec.effect("check", hang=True)), count=3, name="checks"), put(other=True)),
                 put(after=True))
        handle = await sub.new_case(wf)
        await clock.advance(0)
        assert handle.status().effects_pending == 3
        await sub.cancel_region(handle.case_id, "checks")
        result = await handle.result()
        alone = await sub.new_case(mi(effect(rec.effect("solo", hang=True)), count=2, name="checks"))
        await clock.advance(0)
        await sub.cancel_region(alone.case_id, "checks")
        with pytest.raises(CaseCancelled, match="withdrawn"):
            await alone.result()
    assert result == {"other": True, "after": True}
    assert rec.cancelled == ["check"] * 3 + ["solo"] * 2


async def test_wcp27_complete_mi_activity() -> None:
    """WCP27: completing a named mi cancels the rest and joins with the outputs so far."""
    async with running() as (sub, clock, _):
        wf = seq(
            mi(seq(sleep_by_index(), task(lambda c: {"v": c["index"]})), count=3, name="lines", collect="out"),
            count("after"),
        )
        handle = await sub.new_case(wf)
        await clock.advance(2)
        await sub.complete_region(handle.case_id, "lines")
        result = await handle.result()
    assert result["out"] == [{"v": 0}, {"v": 1}, None]
    assert result["after"] == 1


async def test_wcp16_deferred_choice_by_signal_and_by_timeout() -> None:
    """WCP16: the first signal (or the timeout) picks the branch; the others are withdrawn."""
    wf = defer(
        {"approve": put(outcome="approved"), "reject": put(outcome="rejected")},
        timeout=60,
        on_timeout=put(outcome="expired"),
    )
    async with running() as (sub, clock, _):
        approved = await sub.new_case(wf)
        expired = await sub.new_case(wf)
        await sub.signal(approved.case_id, "approve", {"by": "ann"})
        await clock.advance(60)
        assert (await approved.result())["outcome"] == "approved"
        assert (await approved.result())["approve"] == {"by": "ann"}
        assert (await expired.result())["outcome"] == "expired"


async def test_wcp40_interleaved_routing() -> None:
    """WCP40: every branch runs exactly once, in any order, and never two at a time."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = interleave(*(effect(rec.effect(n, delay=1), name=n) for n in ("a", "b", "c")))
        handle = await sub.new_case(wf)
        await clock.advance(3)
        await handle.result()
    assert sorted(rec.calls) == ["a", "b", "c"]
    assert rec.max_active == 1


async def test_wcp17_interleaved_parallel_routing_with_a_partial_order() -> None:
    """WCP17: `order` pairs force some branches before others, still one at a time."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = interleave(
            effect(rec.effect("pack", delay=1), name="pack"),
            effect(rec.effect("invoice", delay=1), name="invoice"),
            effect(rec.effect("pick", delay=1), name="pick"),
            order=[("pick", "pack"), ("pack", "invoice")],
        )
        handle = await sub.new_case(wf)
        await clock.advance(3)
        await handle.result()
    assert rec.calls == ["pick", "pack", "invoice"]
    assert rec.max_active == 1


async def test_wcp18_milestone() -> None:
    """WCP18: a branch may run only while the milestone is reached; once it has passed it is withdrawn."""
    def flow() -> Any:
        return par(
            milestone("shipped", wait("delivered")),
            seq(wait("change"), when_milestone("shipped", put(changed=True))),
        )

    async with running() as (sub, clock, _):
        inside = await sub.new_case(flow())
        await sub.signal(inside.case_id, "change")
        await clock.advance(0)  # the change is handled while the milestone holds
        await sub.signal(inside.case_id, "delivered")
        assert (await inside.result()).get("changed") is True

        late = await sub.new_case(flow())
        await sub.signal(late.case_id, "delivered")
        await clock.advance(0)
        await sub.signal(late.case_id, "change")
        assert "changed" not in await late.result()


async def test_wcp19_wcp25_cancel_task_and_region() -> None:
    """WCP19/25: cancelling a scope withdraws its work; on_cancel lets the thread continue."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = seq(
            scope("checks", par(effect(rec.effect("credit", hang=True)), seq(sleep(5), put(slow=True))),
                  on_cancel=put(checks="skipped")),
            put(after=True),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        await sub.cancel_region(handle.case_id, "checks")
        await clock.advance(10)
        result = await handle.result()
    assert result == {"checks": "skipped", "after": True}
    assert rec.cancelled == ["credit"]


async def test_wcp21_structured_loops() -> None:
    """WCP21: while_, until and times loops, with an effect in the body."""
    async def bump(ctx: Any) -> dict[str, Any]:
        return {"n": ctx["n"] + 1}

    async with running() as (sub, _, _):
        w = await sub.new_case(loop(effect(bump), while_=lambda c: c["n"] < 3), {"n": 0})
        u = await sub.new_case(loop(effect(bump), until=lambda c: c["n"] >= 5), {"n": 0})
        t = await sub.new_case(loop(effect(bump), times=4), {"n": 0})
        assert [(await h.result())["n"] for h in (w, u, t)] == [3, 5, 4]


async def test_wcp22_recursion_through_the_library() -> None:
    """WCP22: call(name) runs a library workflow, recursively."""
    countdown = seq(
        task(lambda c: {"n": c["n"] - 1, "trail": [*c["trail"], c["n"]]}),
        xor((lambda c: c["n"] > 0, call("countdown")), default=put(landed=True)),
    )
    async with running(library={"countdown": countdown}) as (sub, _, _):
        result = await (await sub.new_case(call("countdown"), {"n": 3, "trail": []})).result()
    assert result["trail"] == [3, 2, 1]
    assert result["landed"] is True


async def test_wcp23_transient_trigger_is_dropped_when_nobody_waits() -> None:
    """WCP23: a transient signal sent before anyone waits is lost; one sent while waiting is taken."""
    wf = seq(sleep(1), wait("ping", transient=True))
    async with running() as (sub, clock, sink):
        handle = await sub.new_case(wf)
        await sub.signal(handle.case_id, "ping", "early")
        await clock.advance(1)
        assert handle.status().signals == ("ping",)
        await sub.signal(handle.case_id, "ping", "on time")
        assert (await handle.result())["ping"] == "on time"
    assert "signal_dropped" in sink.kinds(handle.case_id)


async def test_wcp24_persistent_trigger_is_buffered() -> None:
    """WCP24: a signal sent before anyone waits is kept (FIFO per name) until a wait takes it."""
    wf = seq(sleep(1), wait("ping", into="first"), wait("ping", into="second"))
    async with running() as (sub, clock, _):
        handle = await sub.new_case(wf)
        await sub.signal(handle.case_id, "ping", 1)
        await sub.signal(handle.case_id, "ping", 2)
        await clock.advance(1)
        result = await handle.result()
    assert (result["first"], result["second"]) == (1, 2)


async def test_wcp39_critical_section() -> None:
    """WCP39: critical sections of one case with the same name never overlap."""
    async with running() as (sub, clock, _):
        rec = Recorder(clock)
        wf = par(
            critical("ledger", effect(rec.effect("debit", delay=1))),
            critical("ledger", effect(rec.effect("credit", delay=1))),
            effect(rec.effect("notify", delay=1)),
        )
        handle = await sub.new_case(wf)
        await clock.advance(0)
        assert handle.status().effects_pending == 2
        await clock.advance(2)
        await handle.result()
    assert sorted(rec.calls) == ["credit", "debit", "notify"]


async def test_wcp43_explicit_termination() -> None:
    """WCP43: terminate() cancels all remaining work and the case ends as done."""
    async with running() as (sub, clock, sink):
        rec = Recorder(clock)
        wf = par(
            seq(effect(rec.effect("watch", hang=True))),
            seq(sleep(1), put(stop=True), terminate()),
        )
        handle = await sub.new_case(wf)
        await clock.advance(1)
        result = await handle.result()
    assert result["stop"] is True
    assert rec.cancelled == ["watch"]
    assert "terminated" in sink.kinds(handle.case_id)

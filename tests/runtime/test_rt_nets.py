"""A net run for real: a Substrate on a virtual clock runs its effects, delivers its signal and traces its joins."""

from __future__ import annotations

from wfsub import net, wait

from ..harness import Recorder, running, trace_of


async def test_a_net_with_effects_a_signal_and_a_cycle_runs_through_the_substrate() -> None:
    """A net with effects, a signal, an or-join and a rework cycle runs on a Substrate; the trace shows its joins."""
    async with running(trace_level="min") as (sub, clock, sink):
        rec = Recorder(clock)
        review = net(
            {
                "check": rec.effect("check", lambda c: {"checks": c.get("checks", 0) + 1}, delay=1),
                "approval": wait("approved", into="approval"),
                "decide": rec.step("decide", lambda c: {"rounds": c.get("rounds", 0) + 1}),
                "rework": rec.effect("rework", delay=2),
            },
            [
                ("start", "check"),
                ("start", "approval"),
                ("check", "decide"),
                ("approval", "decide"),
                ("decide", "rework", lambda c: not c["approval"]["ok"] and c["rounds"] < 2),
                ("decide", "end"),
                ("rework", "check"),
            ],
            split={"decide": "xor"},
            join={"decide": "or"},
        )
        handle = await sub.new_case(review)
        await clock.advance(1)
        status = handle.status()
        assert (status.state, rec.calls, rec.steps) == ("waiting_signal", ["check"], [])  # decide waits: approval
        await handle.signal("approved", {"ok": False})
        await clock.advance(3)  # rework (2 s), then check again (1 s)
        result = await handle.result()
    assert result == {"checks": 2, "approval": {"ok": False}, "rounds": 2, "rework": True}
    assert (rec.calls, rec.steps) == (["check", "rework", "check"], ["decide", "decide"])
    joins = [(path, d["edges"]) for _, path, d in trace_of(sink.for_case(handle.case_id), "net_join")]
    assert joins == [("net[decide].task", ["check", "approval"]), ("net[decide].task", ["check"])]

"""Retry as a property over generated workflows and journals (the drivers of `tests/durable/test_replay_property`):
a generated case that failed, with a `retry` record appended, replays without divergence to the state before the
step that failed: a failed task fails again on the same program with the same data, and an effect whose error
failed the case is requested again with no outcome (as if it were slow); a failure whose withdrawal ran handlers is
refused."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import wfsub
from wfsub import SignalRejected, seq
from wfsub._runtime._journal import effective
from wfsub._runtime._replay import Replayer
from wfsub._store import CaseRow
from wfsub.lowlevel import retry_record

from ..durable.test_replay_property import ACTIONS, Builder, Live


@pytest.mark.long
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.data(), ACTIONS, st.integers(1, 7))
def test_a_retried_journal_replays_to_the_step_that_failed(
    data: st.DataObject, actions: list[tuple[str, int]], quanta: int
) -> None:
    """A failed generated case plus its `retry` record replays without divergence: the failed effect's outcome is
    gone (it is in flight again unless the case went on without it), or (a task failed) the same failure comes
    again with the same data."""
    builder = Builder(data)
    term = seq(*(builder.term(3) for _ in range(data.draw(st.integers(1, 3)))))
    assume(not wfsub.validate(term))
    program = wfsub.compile(term)
    live = Live(program)
    regions = {"any": builder.scopes + builder.mis + builder.dynamic, "dynamic": builder.dynamic}
    live.run(quanta)
    for action in actions:
        live.give(action, regions)
    live.finish(regions)
    assume(str(live.m.status) == "failed")
    records = live.records
    end = records[-1]  # with the error as the runtime records it: where the case failed
    end["error"] = {"type": "X", "message": "x", "path": live.m.error_path, "record": live.m.failure_record}
    row = CaseRow("p", "gen", program.fingerprint, "failed", 0.0, 0.0, last_seq=end["seq"])
    try:
        retry = retry_record("p", row, records, live.time + 1)
    except SignalRejected:
        event("refused: its failure ran handlers")
        return  # its failure ran compensations: refused, nothing to replay
    event(f"redo {len(retry['redo'])}")
    report = wfsub.replay(term, [*records, retry], trace_level="none")
    assert report.divergence is None, report.divergence
    replayer = Replayer(program, records[0])
    kept = effective([*records, retry])
    for record in kept[1:]:
        replayer.apply(record)
    replayer.run()
    if retry["redo"]:  # unanswered, as if it were slow: in flight, unless the case went on without it meanwhile
        (redone,) = retry["redo"]  # (a branch beside it won a first-join, withdrew it, or failed at another step)
        effect_id = records[redone]["effect_id"]
        assert all(r.get("effect_id") != effect_id for r in kept if r["kind"] == "effect")
        assert effect_id in replayer.effects or effect_id not in set(replayer.machine.effect_ids())
    else:
        assert (report.state, report.data) == ("failed", live.m.data)

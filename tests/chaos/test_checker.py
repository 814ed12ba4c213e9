"""The chaos checker fails on each kind of violation, fed a doctored history, and passes a sound one; the fault
schedule is a function of the seed alone."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from ._campaign import Settings, crash_lines, load_history, schedule
from ._checker import History, Violation, check
from ._workload import CaseSpec, Op, plan

LEASE = {"seconds": 2.0, "since_sent": 0.4, "since_done": 0.39, "renewals": 3}


def _sound() -> History:
    """Two cases that went right: one approved on node n0, one cancelled after a takeover by n1."""
    specs = [
        CaseSpec("c1", "order", {"n": 1}, at=0, starter=0, sender=1, ops=[Op("signal", "approve", "c1:approve")]),
        CaseSpec("c2", "order", {"n": 2}, at=0, starter=1, sender=0, ops=[Op("cancel", "approve", "c2:cancel")],
                 expect="cancelled"),
    ]
    acks = [
        {"ev": "ack", "op": "start", "case": "c1", "key": "start:c1", "outcome": "ok"},
        {"ev": "ack", "op": "signal", "case": "c1", "key": "signal:c1:approve", "rid": "c1:approve",
         "outcome": "error", "error": "CommitUnknown: ..."},
        {"ev": "ack", "op": "signal", "case": "c1", "key": "signal:c1:approve", "rid": "c1:approve", "outcome": "ok"},
        {"ev": "ack", "op": "start", "case": "c2", "key": "start:c2", "outcome": "ok"},
        {"ev": "ack", "op": "cancel", "case": "c2", "key": "cancel:c2:cancel", "rid": "c2:cancel", "outcome": "ok"},
    ]
    journals = {
        "c1": [{"seq": 0, "kind": "start", "time": 100.0},
               {"seq": 1, "kind": "effect", "time": 100.1, "effect_id": 1},
               {"seq": 2, "kind": "signal", "time": 101.0, "name": "approve", "request_id": "c1:approve"},
               {"seq": 3, "kind": "end", "time": 101.5, "outcome": "done"}],
        "c2": [{"seq": 0, "kind": "start", "time": 100.0},
               {"seq": 1, "kind": "cancel", "time": 102.0, "request_id": "c2:cancel"},
               {"seq": 2, "kind": "end", "time": 102.5, "outcome": "cancelled"}],
    }
    epochs = {"c1": [(0, 1), (1, 1), (2, 1), (3, 1)], "c2": [(0, 1), (1, 2), (2, 2)]}
    effects = [{"ev": "effect", "case": "c1", "key": "c1:1:seq[0].effect", "attempt": 1, "node": "n0", "pid": 7,
                "t": 100.05, "lease": dict(LEASE)}]
    samples = [{"t": 110.0 + i, "case": "c1", "state": "done", "last_seq": 3, "owner": "n0", "effects": 0,
                "next_due": None, "inbox": 0, "owner_live": True} for i in range(20)]
    return History(specs=specs, acks=acks, journals=journals, epochs=epochs, effects=effects, samples=samples,
                   lease_seconds=2.0, stranded_after=10.0)


def kinds(found: list[Violation]) -> list[str]:
    return sorted(v.kind for v in found)


def test_a_sound_history_passes() -> None:
    """A history where every call landed once and every case ended as its calls say has no violation."""
    assert check(_sound()) == []


def _doctor(change: Any) -> list[str]:
    h = copy.deepcopy(_sound())
    change(h)
    return kinds(check(h))


def test_an_acknowledged_signal_missing_from_the_journal_is_a_violation() -> None:
    """A signal whose call returned but whose request id is not in the journal is reported lost."""
    def drop(h: History) -> None:
        del h.journals["c1"][2]
        for i, r in enumerate(h.journals["c1"]):
            r["seq"] = i
        h.samples = [{**s, "last_seq": 2} for s in h.samples]  # the row agrees with the journal
    assert _doctor(drop) == ["acknowledged-input-lost"]


def test_an_input_applied_twice_is_a_violation() -> None:
    """One request id in two journal records (a retried call applied twice) is reported."""
    def twice(h: History) -> None:
        j = h.journals["c1"]
        j.insert(3, {**j[2], "seq": 3})
        j[4]["seq"] = 4
        h.samples = [{**s, "last_seq": 4} for s in h.samples]
    assert _doctor(twice) == ["input-applied-twice"]


def test_an_applied_input_answered_refused_is_a_violation() -> None:
    """A retried call answered SignalRejected whose request id the journal applied is reported."""
    def refused(h: History) -> None:
        h.acks[2]["outcome"] = "rejected"
    assert _doctor(refused) == ["applied-input-reported-refused"]


def test_a_case_ending_twice_or_never_or_wrongly_is_a_violation() -> None:
    """Two ends, no end, and an end in another state than the calls lead to are each reported."""
    def two_ends(h: History) -> None:
        h.journals["c2"].append({"seq": 3, "kind": "end", "time": 103.0, "outcome": "cancelled"})
    assert _doctor(two_ends) == ["case-ended-twice", "record-after-end"]

    def no_end(h: History) -> None:
        h.journals["c2"].pop()
    assert _doctor(no_end) == ["case-not-ended"]

    def failed(h: History) -> None:
        h.journals["c1"][3]["outcome"] = "failed"
    assert _doctor(failed) == ["wrong-outcome"]


def test_a_case_row_out_of_step_with_its_journal_is_a_violation() -> None:
    """A row that lags the journal well after its last append, or names records the journal lacks, is reported."""
    def behind(h: History) -> None:
        h.samples = [{**s, "last_seq": 2} for s in h.samples]
    assert _doctor(behind) == ["row-behind-journal"]

    def ahead(h: History) -> None:
        h.samples = [{**s, "last_seq": 5} for s in h.samples]
    assert _doctor(ahead) == ["row-ahead-of-journal"]


def test_an_epoch_going_back_is_a_violation() -> None:
    """A record appended under a lower epoch than the one before it is reported."""
    def back(h: History) -> None:
        h.epochs["c2"] = [(0, 1), (1, 2), (2, 1)]
    assert _doctor(back) == ["epoch-went-back"]


def test_an_effect_started_with_the_lease_in_doubt_is_a_violation() -> None:
    """An attempt started more than a lease after the node sent its last successful renewal is reported."""
    def stale(h: History) -> None:
        h.effects[0]["lease"]["since_sent"] = 2.5
    assert _doctor(stale) == ["effect-while-lease-in-doubt"]

    def never(h: History) -> None:
        h.effects[0]["lease"]["since_sent"] = None
    assert _doctor(never) == ["effect-while-lease-in-doubt"]


def test_an_effect_started_after_its_case_ended_is_a_violation() -> None:
    """An attempt started seconds after the case's end was journaled (a stale actor) is reported."""
    def late(h: History) -> None:
        h.effects[0]["t"] = 105.0
    assert _doctor(late) == ["effect-after-end"]


def test_a_case_with_work_waiting_and_no_progress_is_stranded() -> None:
    """A running case whose journal does not grow for longer than the bound is reported stranded; one that grows
    is not."""
    def stuck(h: History) -> None:
        h.samples = [{**s, "state": "running"} for s in h.samples]
    assert _doctor(stuck) == ["case-stranded"]

    def inbox(h: History) -> None:
        h.samples = [{**s, "state": "waiting_signal", "inbox": 1} for s in h.samples]
    assert _doctor(inbox) == ["case-stranded"]

    def all_calls_made(h: History) -> None:
        h.samples = [{**s, "state": "waiting_signal", "calls_done": True} for s in h.samples]
    assert _doctor(all_calls_made) == ["case-stranded"]

    def moving(h: History) -> None:
        h.samples = [{**s, "state": "running" if i < 3 else "done", "last_seq": min(i, 3)}
                     for i, s in enumerate(h.samples)]
    assert _doctor(moving) == []


def test_a_call_that_never_returned_is_a_violation() -> None:
    """A planned call with no final outcome once faults stopped (only errors) is reported."""
    def errors_only(h: History) -> None:
        h.acks = [a for a in h.acks if a["outcome"] != "ok" or a["key"] != "signal:c1:approve"]
    assert "call-never-acknowledged" in _doctor(errors_only)


def test_a_process_that_ended_by_itself_is_a_violation() -> None:
    """A node process that exited without a fault killing it is reported, with the end of its stderr."""
    def crashed(h: History) -> None:
        h.exits = [{"src": "pg1", "inc": 2, "rc": 1, "stderr": ["ConnectionResetError: [Errno 104]"]}]
    assert _doctor(crashed) == ["process-crashed"]


def test_an_open_that_gave_up_within_the_retry_window_is_a_violation() -> None:
    """A node whose store open failed before retry_for had passed is reported; one that failed after it is not."""
    def early(h: History) -> None:
        h.open_failures = [{"src": "pg0", "inc": 3, "node": "n0", "after": 0.4, "retry_for": 6.0, "error": "..."}]
    assert _doctor(early) == ["open-gave-up-early"]

    def late(h: History) -> None:
        h.open_failures = [{"src": "pg0", "inc": 3, "node": "n0", "after": 6.2, "retry_for": 6.0, "error": "..."}]
    assert _doctor(late) == []


def test_a_crash_is_summed_up_by_its_wfsub_frames_and_exceptions() -> None:
    """A process's traceback is cut down to the wfsub frames it passed and the exceptions it raised."""
    stderr = """  + Exception Group Traceback (most recent call last):
  |   File "/x/wfsub/_runtime/_substrate.py", line 459, in __aexit__
  | ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)
    |   File "/x/wfsub/_store/_postgres.py", line 581, in _pooled
    | asyncpg.exceptions._base.InterfaceError: cannot call Connection.terminate()
"""
    assert crash_lines(stderr) == [
        'File "/x/wfsub/_runtime/_substrate.py", line 459, in __aexit__',
        'File "/x/wfsub/_store/_postgres.py", line 581, in _pooled',
        "ExceptionGroup: unhandled errors in a TaskGroup (1 sub-exception)",
        "asyncpg.exceptions._base.InterfaceError: cannot call Connection.terminate()",
    ]


def test_a_violation_renders_its_kind_case_and_records() -> None:
    """The report line names the kind and the case, and shows the records that show it."""
    h = _sound()
    h.effects[0]["lease"]["since_sent"] = 9.0
    (found,) = check(h)
    text = found.render()
    assert text.startswith("VIOLATION effect-while-lease-in-doubt case=c1:") and '"since_sent":9.0' in text


@pytest.mark.parametrize("seed", [1, 2, 12345])
def test_the_schedule_and_plan_are_functions_of_the_seed(seed: int) -> None:
    """The same seed gives the same faults and cases; another seed gives other faults."""
    s = Settings(seed=seed, fault_seconds=60)
    assert schedule(s) == schedule(Settings(seed=seed, fault_seconds=60))
    assert schedule(s) != schedule(Settings(seed=seed + 1, fault_seconds=60))
    assert [c.to_json() for c in plan(seed, "p", 30, 3, 50)] == [c.to_json() for c in plan(seed, "p", 30, 3, 50)]
    assert {f.kind for f in schedule(s)} <= {"kill", "stop", "restart", "cut", "drop", "lose-commit", "delay",
                                             "sqlite-kill", "sqlite-full"}


def test_a_kept_run_is_checked_again_from_its_files(tmp_path: Path) -> None:
    """A work directory's history.jsonl and stores.json give back the history the run checked, violations and all."""
    h = _sound()
    h.effects[0]["lease"]["since_sent"] = 3.0
    lines = [*h.acks, *h.effects]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    (tmp_path / "stores.json").write_text(json.dumps({
        "specs": [c.to_json() for c in h.specs], "journals": h.journals, "epochs": h.epochs, "samples": h.samples,
        "lease_seconds": h.lease_seconds, "stranded_after": h.stranded_after,
    }))
    assert kinds(check(load_history(tmp_path))) == ["effect-while-lease-in-doubt"]

"""start_case and signal_case below the runtime: validation (with node paths and the fix), how they compile (an
effect to the vm, so a bare Machine asks its driver for them), their fingerprints, and their diagrams."""

from __future__ import annotations

import anyio
import pytest

import wfsub
from wfsub import mi, seq, signal_case, start_case, task
from wfsub.lowlevel import Machine

LIB = {"kid": task(lambda c: None), "other": task(lambda c: None)}


def messages(term: object) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in wfsub.validate(term, library=LIB)]


def test_start_case_of_an_unregistered_workflow_names_the_path_and_the_registered_names() -> None:
    """A start_case of a name no workflow has is reported at its node with the registered names and the fix."""
    [(path, message)] = messages(seq(task(lambda c: None), start_case("kdi")))
    assert path == "seq[1].start_case"
    assert "'kdi'" in message and "registered: kid, other" in message and "workflows=" in message
    [(_, message)] = [(i.path, i.message) for i in wfsub.validate(start_case("kid"))]
    assert "Substrate(workflows=" in message


def test_bad_start_case_and_signal_case_arguments_are_each_reported() -> None:
    """Not-callable data=/case_id=/payload=, a bad into=, wait= or on_parent_cancel= each get their own issue."""
    found = messages(start_case("kid", data={"x": 1}, case_id="fixed", wait="yes", into="", on_parent_cancel="x"))
    text = " | ".join(m for _, m in found)
    for words in ("data= must be a function", "case_id= must be a function", "wait= must be True",
                  "into= must be a non-empty str", "on_parent_cancel='x' is not a policy"):
        assert words in text, text
    found = messages(signal_case("", case_id="order-1", payload=3))
    text = " | ".join(m for _, m in found)
    for words in ("signal name", "case_id= must be a function", "payload= must be a function"):
        assert words in text, text
    assert messages(seq(start_case("kid", data=lambda c: {}, into="r"), signal_case("go", case_id=lambda c: "x"))) == []


def test_they_compile_to_effects_a_bare_machine_asks_its_driver_for() -> None:
    """The vm sees an effect at the step's path (named after the step); awaiting its function outside a
    Substrate says that a Substrate runs it."""
    program = wfsub.compile(mi(start_case("kid"), count=2), library=LIB)
    m = Machine(program, {})
    r = m.run(100)
    assert [(e.path, e.name) for e in r.effects] == [("mi.start_case", "start_case('kid')")] * 2
    with pytest.raises(RuntimeError, match="only a Substrate can do"):
        anyio.run(r.effects[0].fn, {})
    m.complete_effect(r.effects[0].effect_id, {"child": "a"})
    m.complete_effect(r.effects[1].effect_id, {"child": "b"})
    assert m.run(100).status.value == "done"


def test_the_fingerprint_covers_their_arguments() -> None:
    """Another workflow, key or policy is another version (their functions' code is in it too)."""
    prints = {
        wfsub.compile(t, library=LIB).fingerprint
        for t in (start_case("kid"), start_case("other"), start_case("kid", into="r"),
                  start_case("kid", on_parent_cancel="abandon"), start_case("kid", wait=False),
                  signal_case("go", case_id=lambda c: "a"), signal_case("stop", case_id=lambda c: "a"))
    }
    assert len(prints) == 7


def test_diagrams_draw_a_call_activity_and_a_message_throw() -> None:
    """to_mermaid/to_dot draw start_case as a call activity (with its wait and policy) and signal_case as a throw."""
    wf = seq(start_case("kid", into="r"), signal_case("go", case_id=lambda c: "x"),
             start_case("kid", wait=False, on_parent_cancel="abandon"))
    text = wfsub.to_mermaid(wf, highlight="seq[1].signal_case")
    assert 'n1["start case: kid<br>waits<br>into r"]' in text
    assert 'n2>"signal case: go"]' in text and "class n2 highlight" in text
    assert "does not wait<br>abandoned on cancel" in text
    assert "start case: kid" in wfsub.to_dot(wf)


def test_the_vm_and_the_reference_agree_on_outbound_steps_in_every_construct() -> None:
    """start_case and signal_case inside par, mi, scope(on_error) and saga agree with the reference interpreter,
    answered as effects (results and failures)."""
    from .gen import Recorder, a_task
    from .test_differential import check_agreement

    rec = Recorder()
    kid, go = start_case("kid", into="r"), signal_case("go", case_id=lambda c: "x")
    terms = [
        seq(kid, a_task(rec), go),
        wfsub.par(kid, seq(go, a_task(rec))),
        mi(seq(kid, go), count=2, collect="o"),
        wfsub.scope("s", seq(kid, go), on_error=a_task(rec)),
        wfsub.saga((kid, go), (a_task(rec), go)),
    ]
    scripts = [
        [("effect", 1, "ok"), ("effect", 2, "ok"), ("effect", 3, "ok"), ("effect", 4, "ok")],
        [("effect", 1, "error"), ("effect", 2, "ok"), ("effect", 3, "ok")],
    ]
    for term in terms:
        for script in scripts:
            check_agreement(term, rec, list(script), 1000, LIB)


def test_a_start_case_in_a_loop_needs_its_own_case_id() -> None:
    """Inside a loop a start_case without case_id= is reported (each run would find the first run's child)."""
    [(path, message)] = messages(wfsub.loop(start_case("kid"), times=3))
    assert path == "loop.start_case" and "case_id=fn" in message
    assert messages(wfsub.loop(start_case("kid", case_id=lambda c: "k"), times=3)) == []

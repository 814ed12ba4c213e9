"""Differential tests: random terms run by the reference interpreter and by the compiled vm must agree."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wfsub
from wfsub import loop, mi, par, scope, seq, task, xor
from wfsub._terms import Term
from wfsub.lowlevel import Machine

from .reference import Reference


class Recorder:
    """The tasks of one generated term append (task id, instance index) here when they run."""

    def __init__(self) -> None:
        self.runs: list[tuple[int, Any]] = []
        self.next_id = 0
        self.next_scope = 0


def _task(rec: Recorder) -> Term:
    i = rec.next_id
    rec.next_id += 1

    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        x = ctx.get("x", 0)
        rec.runs.append((i, ctx.get("index")))
        return {"x": x + 1, f"t{i}": x}

    step.__qualname__ = f"step{i}"
    return task(step)


def _terms(rec: Recorder) -> st.SearchStrategy[Term]:
    leaf = st.builds(lambda: _task(rec))

    def extend(children: st.SearchStrategy[Term]) -> st.SearchStrategy[Term]:
        lists = st.lists(children, min_size=1, max_size=3)

        @st.composite
        def a_par(draw: Any) -> Term:
            branches = draw(lists)
            join = draw(st.sampled_from(["all", "first", "each", "n"]))
            if join == "n":
                join = draw(st.integers(1, len(branches)))
            return par(*branches, join=join, cancel_remaining=draw(st.booleans()))

        @st.composite
        def a_xor(draw: Any) -> Term:
            branches = draw(lists)
            mods = [draw(st.integers(2, 3)) for _ in branches]
            cases = [
                ((lambda c, m=m: c.get("x", 0) % m == 0), b) for m, b in zip(mods, branches, strict=True)
            ]
            return xor(*cases, default=draw(children))

        @st.composite
        def a_loop(draw: Any) -> Term:
            body = draw(children)
            kind = draw(st.sampled_from(["times", "while", "until"]))
            if kind == "times":
                return loop(body, times=draw(st.integers(0, 2)))
            limit = draw(st.integers(1, 3))
            key = f"w{rec.next_id}"
            rec.next_id += 1

            def bump(ctx: Mapping[str, Any], key: str = key) -> dict[str, Any]:
                return {key: ctx.get(key, 0) + 1}

            counted = seq(body, task(bump))
            if kind == "while":
                return loop(counted, while_=lambda c, key=key, n=limit: c.get(key, 0) < n)
            return loop(counted, until=lambda c, key=key, n=limit: c.get(key, 0) >= n)

        @st.composite
        def a_mi(draw: Any) -> Term:
            body = draw(children)
            n = draw(st.integers(0, 3))
            join = draw(st.sampled_from(["all", "first", None, "n"]))
            if join == "n":
                join = draw(st.integers(1, max(n, 1))) if n else "all"
            collect = draw(st.sampled_from([None, "out"])) if join is not None else None
            if draw(st.booleans()):
                return mi(
                    body, items=lambda c, n=n: list(range(10, 10 + n)), join=join,
                    cancel_remaining=draw(st.booleans()), collect=collect,
                )
            return mi(body, count=n, join=join, cancel_remaining=draw(st.booleans()), collect=collect)

        @st.composite
        def a_scope(draw: Any) -> Term:
            rec.next_scope += 1
            return scope(f"s{rec.next_scope}", draw(children))

        return st.one_of(lists.map(lambda steps: seq(*steps)), a_par(), a_xor(), a_loop(), a_mi(), a_scope())

    return st.recursive(leaf, extend, max_leaves=12)


@st.composite
def cases(draw: Any) -> tuple[Recorder, Term]:
    rec = Recorder()
    return rec, draw(_terms(rec))


def _run_vm(term: Term, rec: Recorder, quanta: int) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
    rec.runs = []
    program = wfsub.compile(term)
    machine = Machine(program)
    for _ in range(100_000):
        result = machine.run(quanta)
        if result.status != "yielded":
            break
    assert result.status == "done", f"{result.status}: {result.error_message}\n{program.dis()}"
    return machine.data, rec.runs


def _run_reference(term: Term, rec: Recorder) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
    rec.runs = []
    data = Reference(term).run()
    return data, rec.runs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from([1, 3, 1000]))
def test_vm_agrees_with_reference_interpreter(case: tuple[Recorder, Term], quanta: int) -> None:
    """Compiled bytecode gives the reference's final data, task runs and run order, for any quanta."""
    rec, term = case
    ref_data, ref_runs = _run_reference(term, rec)
    vm_data, vm_runs = _run_vm(term, rec, quanta)
    dis = wfsub.compile(term).dis()
    assert Counter(vm_runs) == Counter(ref_runs), f"{term!r}\n{dis}"
    assert vm_runs == ref_runs, f"{term!r}\n{dis}"
    assert vm_data == ref_data, f"{term!r}\n{dis}"

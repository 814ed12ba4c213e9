"""Deep and wide terms: building, hashing, comparing, printing, validating and compiling never hit Python's
recursion limit; a term nested past the limit gets one clear validation issue instead."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import wfsub
from wfsub import critical, interleave, loop, mi, par, scope, seq, task, validate, xor
from wfsub._terms import Term
from wfsub._validate import MAX_DEPTH
from wfsub.lowlevel import Machine


def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx.get("n", 0) + 1}


def always(ctx: Mapping[str, Any]) -> bool:
    return True


WRAPPERS: dict[str, Callable[[Term, int], Term]] = {
    "par": lambda t, i: par(t, task(step)),
    "loop": lambda t, i: loop(t, times=1),
    "scope": lambda t, i: scope(f"s{i}", t),
    "xor": lambda t, i: xor((always, t)),
    "mi": lambda t, i: mi(t, count=1),
    "interleave": lambda t, i: interleave(t),
    "critical": lambda t, i: critical(f"c{i}", t),
    "seq": lambda t, i: seq(task(step), t),
}


def nested(kinds: list[str]) -> Term:
    term = task(step)
    for i, kind in enumerate(kinds):
        term = WRAPPERS[kind](term, i)
    return term


def depth(term: Term) -> int:
    best, stack = 0, [(term, 1)]
    while stack:
        node, d = stack.pop()
        best = max(best, d)
        stack.extend((child, d + 1) for _, child in wfsub._terms.children(node))
    return best


def test_a_builder_loop_of_any_length_stays_flat_and_runs() -> None:
    """`wf = seq(wf, task(step))` 5,000 times validates, compiles, prints, compares and runs like a flat seq."""
    first, second = task(step), task(step)
    for _ in range(5_000):
        first, second = seq(first, task(step)), seq(second, task(step))
    assert first == second and hash(first) == hash(second)
    assert repr(first).startswith("seq(task(step), task(step)")
    assert validate(first) == []
    machine = Machine(wfsub.compile(first))
    while machine.run(10_000).status == "yielded":
        pass
    assert (machine.status, machine.data) == ("done", {"n": 5_001})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(sorted(WRAPPERS)), min_size=1, max_size=3 * MAX_DEPTH))
def test_any_nesting_is_handled_or_refused_with_one_clear_issue(kinds: list[str]) -> None:
    """Hash, ==, repr never fail at any depth; up to the limit a term compiles, past it validate says why."""
    a, b = nested(kinds), nested(kinds)
    assert a == b and hash(a) == hash(b)
    assert repr(a) == repr(b)
    issues = validate(a)
    if depth(a) <= MAX_DEPTH:
        assert issues == []
        assert wfsub.compile(a).fingerprint == wfsub.compile(b).fingerprint
    else:
        assert len(issues) == 1 and f"more than {MAX_DEPTH} deep" in issues[0].message


def test_the_deepest_allowed_term_runs_to_the_end() -> None:
    """A term exactly at the nesting limit compiles and runs in the vm (every wrapper kind mixed)."""
    kinds = [sorted(WRAPPERS)[i % len(WRAPPERS)] for i in range(MAX_DEPTH * 2)]
    term = nested(kinds)
    while depth(term) > MAX_DEPTH:
        kinds.pop()
        term = nested(kinds)
    assert depth(term) == MAX_DEPTH
    machine = Machine(wfsub.compile(term))
    while machine.run(10_000).status == "yielded":
        pass
    assert machine.status == "done", machine.error_message


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3_000), st.sampled_from(["par", "seq", "interleave"]))
def test_wide_terms_compile_and_run(width: int, kind: str) -> None:
    """Thousands of siblings in one par, seq or interleave compile and run to the end."""
    build = {"par": par, "seq": seq, "interleave": interleave}[kind]
    term = build(*[task(step) for _ in range(width)])
    machine = Machine(wfsub.compile(term))
    while machine.run(100_000).status == "yielded":
        pass
    assert machine.data == {"n": width}

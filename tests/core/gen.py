"""Random workflows and input scripts for the differential and fuzz tests (hypothesis strategies)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

import wfsub
from wfsub import (
    add_instances,
    call,
    cancel_region,
    close_instances,
    complete_region,
    critical,
    defer,
    effect,
    interleave,
    loop,
    mi,
    milestone,
    multi_choice,
    par,
    reply,
    saga,
    scope,
    seq,
    sleep,
    task,
    terminate,
    wait,
    when_milestone,
    xor,
)
from wfsub._terms import Term

SIGNALS = ("s0", "s1", "s2")
REGIONS = ("r0", "r1", "r2")  # scopes (several may share a name)
MIS = ("m0", "m1")  # named mis (dynamic ones among them)
LOCKS = ("L0", "L1")
MILESTONES = ("M0",)
ALL_KINDS = frozenset({
    "task", "fail", "seq", "par", "xor", "loop", "mi", "scope", "effect", "wait", "sleep", "defer", "multi_choice",
    "saga", "interleave", "critical", "milestone", "call", "terminate", "region_steps", "dynamic", "updates",
})


class Recorder:
    """The tasks of one generated term append (task id, instance index) here when they run."""

    def __init__(self, kinds: frozenset[str] = ALL_KINDS) -> None:
        self.runs: list[tuple[int, Any]] = []
        self.next_id = 0
        self.kinds = kinds
        self.library: dict[str, Term] = {}

    def callee(self) -> Term:
        """`call("lib")`, with "lib" a small recursive workflow (it calls itself until x reaches 3)."""
        if not self.library:
            again = xor((lambda c: c.get("x", 0) < 3, call("lib")), default=a_task(self))
            self.library["lib"] = seq(a_task(self), scope("r0", again), a_task(self))
        return call("lib")

    def fresh(self) -> int:
        self.next_id += 1
        return self.next_id


async def _work(ctx: Mapping[str, Any]) -> None:
    return None


# Timers from data: lengths and times computed from the data the tasks wrote, now and then invalid (a string, zero
# for a wait's timeout, a naive time), so both sides must fail the step at the same node.


def data_seconds(ctx: Mapping[str, Any]) -> Any:
    x = ctx.get("x", 0)
    return "soon" if x % 7 == 6 else float(x % 3)


def data_timeout(ctx: Mapping[str, Any]) -> Any:
    x = ctx.get("x", 0)
    return 0 if x % 6 == 5 else 1 + x % 4


def data_until(ctx: Mapping[str, Any]) -> Any:
    x = ctx.get("x", 0)
    return f"2027-01-0{1 + x % 9}T00:00:00" + ("" if x % 5 == 4 else "Z")


def not_thirds(ctx: Mapping[str, Any], payload: Any) -> str | None:
    return "divisible by 3" if isinstance(payload, int) and payload % 3 == 0 else None


def answer(ctx: Mapping[str, Any]) -> Any:
    return len(ctx)


def a_task(rec: Recorder, fails: bool = False) -> Term:
    i = rec.fresh()

    def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
        x = ctx.get("x", 0)
        rec.runs.append((i, ctx.get("index")))
        if fails and x % 3 == 2:
            raise ValueError(f"task {i} fails at x={x}")
        return {"x": x + 1, f"t{i}": x}

    step.__qualname__ = f"{'fail' if fails else 'step'}{i}"
    return task(step)


def _leaf(rec: Recorder) -> st.SearchStrategy[Term]:
    k = rec.kinds
    options: list[st.SearchStrategy[Term]] = [st.builds(lambda: a_task(rec))] * 3
    if "fail" in k:
        options.append(st.builds(lambda: a_task(rec, fails=True)))
    if "effect" in k:
        options.append(st.builds(lambda: effect(_work, name=f"e{rec.fresh()}")))
    if "wait" in k:
        options.append(st.builds(
            lambda s, tr, to: wait(s, transient=tr, timeout=to),
            st.sampled_from(SIGNALS), st.booleans(), st.sampled_from([None, None, 5.0, data_timeout]),
        ))
    if "sleep" in k:
        options.append(st.sampled_from([sleep(1.0), sleep(1.0), sleep(data_seconds), sleep(until=data_until)]))
    if "updates" in k:  # checked waits (a check refuses payloads divisible by 3), reply steps after waits
        options.append(st.builds(
            lambda s, to, r: seq(wait(s, check=not_thirds, timeout=to), reply(s, answer)) if r
            else wait(s, check=not_thirds, reply=answer),
            st.sampled_from(SIGNALS), st.sampled_from([None, 5.0, data_timeout]), st.booleans(),
        ))
    if "call" in k:
        options.append(st.builds(rec.callee))
    if "terminate" in k:
        options.append(st.just(terminate()))
    return st.one_of(*options)


# The constructs' strategies, decorated once here rather than inside `terms` for every term drawn: hypothesis reads
# a composite's source as it decorates it (to check it draws), which cost most of a property test's time.


@st.composite
def _a_par(draw: Any, lists: st.SearchStrategy[list[Term]]) -> Term:
    branches = draw(lists)
    join = draw(st.sampled_from(["all", "first", "each", "n"]))
    if join == "n":
        join = draw(st.integers(1, len(branches)))
    cancel = draw(st.booleans())
    blocking = join not in ("all", "each") and not cancel and draw(st.booleans())
    return par(*branches, join=join, cancel_remaining=cancel, blocking=blocking)


def _cases(draw: Any, lists: st.SearchStrategy[list[Term]]) -> list[tuple[Any, Term]]:
    branches = draw(lists)
    mods = [draw(st.integers(2, 3)) for _ in branches]
    return [((lambda c, m=m: c.get("x", 0) % m == 0), b) for m, b in zip(mods, branches, strict=True)]


@st.composite
def _a_xor(draw: Any, lists: st.SearchStrategy[list[Term]], children: st.SearchStrategy[Term]) -> Term:
    return xor(*_cases(draw, lists), default=draw(st.one_of(st.none(), children)))


@st.composite
def _a_multi_choice(draw: Any, lists: st.SearchStrategy[list[Term]], children: st.SearchStrategy[Term]) -> Term:
    return multi_choice(*_cases(draw, lists), default=draw(st.one_of(st.none(), children)))


@st.composite
def _a_loop(draw: Any, rec: Recorder, children: st.SearchStrategy[Term]) -> Term:
    body = draw(children)
    kind = draw(st.sampled_from(["times", "while", "until"]))
    limit = draw(st.sampled_from([None, None, 2]))
    if kind == "times":
        return loop(body, times=draw(st.integers(0, 2)), max_iterations=limit)
    n = draw(st.integers(1, 3))
    key = f"w{rec.fresh()}"

    def bump(ctx: Mapping[str, Any], key: str = key) -> dict[str, Any]:
        return {key: ctx.get(key, 0) + 1}

    counted = seq(body, task(bump))
    if kind == "while":
        return loop(counted, while_=lambda c, key=key, n=n: c.get(key, 0) < n, max_iterations=limit)
    return loop(counted, until=lambda c, key=key, n=n: c.get(key, 0) >= n, max_iterations=limit)


@st.composite
def _a_mi(draw: Any, rec: Recorder, children: st.SearchStrategy[Term]) -> Term:
    body = draw(children)
    n = draw(st.integers(0, 3))
    dynamic = draw(st.sampled_from([False, False, True, "open"])) if "dynamic" in rec.kinds else False
    join = draw(st.sampled_from(["all", "first", None, "n"]))
    if join == "n":
        join = draw(st.integers(1, 3))
    if not dynamic and isinstance(join, int) and join > n:
        join = n or "all"
    if join == "first" and n == 0 and not dynamic:
        join = "all"
    collect = draw(st.sampled_from([None, "out"])) if join is not None else None
    until = None
    if draw(st.integers(0, 4)) == 0:
        until = lambda s: s.completed >= 2  # noqa: E731
    name = draw(st.sampled_from((None,) + MIS)) if not dynamic else draw(st.sampled_from(MIS))
    run_time = draw(st.booleans())
    count: Any = (lambda c, n=n: n) if run_time else n
    if run_time and join not in ("all", None) and not dynamic and until is None and draw(st.booleans()):
        count = lambda c, n=n: max(n - 1, 0)  # noqa: E731 - below n at run time: a failure at the mi
    if draw(st.booleans()):
        return mi(body, items=lambda c, n=n: list(range(10, 10 + n)), join=join, until=until,
                  cancel_remaining=draw(st.booleans()), collect=collect, dynamic=dynamic, name=name)
    return mi(body, count=count, join=join, cancel_remaining=draw(st.booleans()), collect=collect,
              until=until, dynamic=dynamic, name=name)


@st.composite
def _a_scope(draw: Any, rec: Recorder, children: st.SearchStrategy[Term]) -> Term:
    name = draw(st.sampled_from(REGIONS))
    body = draw(children)
    on_cancel = draw(st.one_of(st.none(), st.builds(lambda: a_task(rec))))
    on_error = draw(st.one_of(st.none(), st.builds(lambda: a_task(rec))))
    finally_ = draw(st.one_of(st.none(), st.builds(lambda: a_task(rec)), children))
    return scope(name, body, on_cancel=on_cancel, on_error=on_error, error_into=f"err{rec.fresh()}",
                 finally_=finally_)


@st.composite
def _a_defer(draw: Any, children: st.SearchStrategy[Term]) -> Term:
    names = draw(st.lists(st.sampled_from(SIGNALS), min_size=1, max_size=2, unique=True))
    branches = {name: draw(children) for name in names}
    if draw(st.booleans()):
        timeout = draw(st.sampled_from([3.0, 3.0, data_timeout]))
        return defer(branches, timeout=timeout, on_timeout=draw(children))
    return defer(branches)


@st.composite
def _a_saga(draw: Any, rec: Recorder, children: st.SearchStrategy[Term]) -> Term:
    steps = draw(st.lists(children, min_size=1, max_size=3))
    return saga(*[(s, a_task(rec)) if draw(st.booleans()) else s for s in steps])


@st.composite
def _an_interleave(draw: Any, lists: st.SearchStrategy[list[Term]]) -> Term:
    branches = draw(lists)
    order = [(0, len(branches) - 1)] if len(branches) > 1 and draw(st.booleans()) else []
    return interleave(*branches, order=order)


@st.composite
def _a_region_pair(draw: Any, rec: Recorder, children: st.SearchStrategy[Term]) -> Term:
    """A region and, beside it, a thread that acts on it (region steps must name a declared region)."""
    name = draw(st.sampled_from(REGIONS + MIS))
    body = draw(children)
    if name in MIS:
        dynamic = draw(st.sampled_from([False, True, "open"]))
        region = mi(body, count=draw(st.integers(0 if dynamic else 1, 2)), dynamic=dynamic, name=name,
                    join=draw(st.sampled_from(["all", "first", None])), collect="out")
    else:
        region = scope(name, body, on_cancel=draw(st.one_of(st.none(), st.builds(lambda: a_task(rec)))),
                       finally_=draw(st.one_of(st.none(), st.builds(lambda: a_task(rec)))))
    before = draw(children)
    steps = [cancel_region(name), complete_region(name)]
    if name in MIS:
        steps += [add_instances(name, items=lambda c: [1, 2]), close_instances(name)]
    acts = draw(st.lists(st.sampled_from(steps), min_size=1, max_size=2))
    return par(region, seq(before, *acts), join=draw(st.sampled_from(["all", "first"])))


def terms(rec: Recorder, max_leaves: int = 14) -> st.SearchStrategy[Term]:
    """Terms that validate, built from the kinds `rec` allows."""
    k = rec.kinds

    def extend(children: st.SearchStrategy[Term]) -> st.SearchStrategy[Term]:
        lists = st.lists(children, min_size=1, max_size=3)
        out: list[st.SearchStrategy[Term]] = [lists.map(lambda steps: seq(*steps))]

        if "region_steps" in k:
            out.append(_a_region_pair(rec, children))
        if "par" in k:
            out.append(_a_par(lists))
        if "xor" in k:
            out.append(_a_xor(lists, children))
        if "multi_choice" in k:
            out.append(_a_multi_choice(lists, children))
        if "loop" in k:
            out.append(_a_loop(rec, children))
        if "mi" in k:
            out.append(_a_mi(rec, children))
        if "scope" in k:
            out.append(_a_scope(rec, children))
        if "defer" in k:
            out.append(_a_defer(children))
        if "saga" in k:
            out.append(_a_saga(rec, children))
        if "interleave" in k:
            out.append(_an_interleave(lists))
        if "critical" in k:
            out.append(st.builds(critical, st.sampled_from(LOCKS), children))
        if "milestone" in k:
            out.append(st.builds(
                lambda a, b, first: par(milestone("M0", a), when_milestone("M0", b), join=first),
                children, children, st.sampled_from(["all", "first"]),
            ))
        return st.one_of(*out)

    valid = st.recursive(_leaf(rec), extend, max_leaves=max_leaves)
    return valid.filter(lambda t: not wfsub.validate(t, library=rec.library))


def scripts(rec: Recorder, max_size: int = 12) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    """Inputs from outside the case: effect outcomes and timer firings (by position among those pending), signals,
    cancels and region operations."""
    k = rec.kinds
    actions: list[st.SearchStrategy[tuple[Any, ...]]] = [
        st.tuples(st.just("effect"), st.integers(0, 3), st.sampled_from(["ok", "ok", "error"])),
        st.tuples(st.just("timer"), st.integers(0, 3)),
        st.tuples(st.just("signal"), st.sampled_from(SIGNALS), st.integers(0, 9)),
    ]
    if "cancel" in k or "scope" in k:
        actions.append(st.tuples(st.just("cancel"), st.booleans()))
        actions.append(st.tuples(st.sampled_from(["cancel_region", "complete_region"]),
                                 st.sampled_from(REGIONS + MIS)))
    if "updates" in k:
        actions.append(st.tuples(st.just("update"), st.sampled_from(SIGNALS), st.integers(0, 9)))
    if "dynamic" in k:
        actions.append(st.tuples(st.just("add_instances"), st.sampled_from(MIS),
                                 st.lists(st.integers(0, 9), max_size=2)))
        actions.append(st.tuples(st.just("close_instances"), st.sampled_from(MIS)))
    return st.lists(st.one_of(*actions), max_size=max_size)


__all__ = ["ALL_KINDS", "Recorder", "a_task", "call", "scripts", "terms"]

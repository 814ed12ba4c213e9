"""Updates in the reference interpreter, written from the contract (not from the vm): an update is a signal with
an id; the wait that takes it answers with `reply=` (on the data with the payload merged), else the thread that took
it owes the answer until a `reply` step of its own. "Ahead" is judged where the thread parks: one that parks with a
reply step of that name still ahead on its own way keeps owing it; one with none ahead answers None, and so does one
that ends. A thread withdrawn while it owes one answers "withdrawn" (a case that ends answers "ended"). A `check=`
refusal of a buffered input is its answer. A reply function that raises or gives no JSON value fails the step, and
that failure is the answer.

"Its own way" is read off the terms, structurally (no predicate is called, no loop count or finished branch looked
at): what the thread is parked at, the rest of its code in its block, and, where that code can end, where the same
thread goes on: out of a block it passes through (a scope, a loop, which may go round again, a call, a handler),
into the next branch of an interleave. Never past the end of a branch of a split or of an mi instance (another
thread may carry on after the join), nor past the end of work being undone. Inside a term: a split's thread goes
into its first branch (a multi_choice's, into any) and never comes out of it; an xor or a deferred choice into any
branch; a scope's thread goes through its body, then its finally_; an mi's thread goes on only past one without a
join; a terminate ends everything.

The vm refuses at once an update that no wait can take any more (a double click after the case passed its
waits); this reference buffers it, as a signal, and the differential test checks that it never takes one the vm
refused (see `tests/core/test_differential.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wfsub._json import output_problem
from wfsub._terms import Wait

from ._blocks import Interleave, Pass

if TYPE_CHECKING:
    from ._blocks import Thread
    from ._engine import Engine


def took(e: Engine, th: Thread, t: Any, path: str, name: str, uid: str) -> None:
    if isinstance(t, Wait) and t.reply is not None:
        answer(e, th, path, name, uid, t.reply)
    else:
        e.owing.append([th, name, uid])


def answer(e: Engine, th: Thread, path: str, name: str, uid: str, fn: Any) -> bool:
    try:
        value = fn(th.env)
    except Exception as exc:
        e.answers.append((uid, "error", name, None))
        e.fail(th.block, "StepFailed", path, str(exc))
        return False
    if output_problem(value, "its answer") is not None:
        e.answers.append((uid, "error", name, None))
        e.fail(th.block, "StepFailed", path, "no JSON value")
        return False
    e.answers.append((uid, "answer", name, value))
    return True


def do_reply(e: Engine, th: Thread, t: Any, path: str) -> None:
    for i, entry in enumerate(e.owing):
        if entry[0] is th and entry[1] == t.name:
            del e.owing[i]
            answer(e, th, path, entry[1], entry[2], t.fn)
            return


def withdrawn(e: Engine, th: Thread) -> None:
    """`th` is withdrawn: an update it owes is answered "withdrawn" (unless the case's end answers it)."""
    for entry in e.owing:
        if entry[0] is th and len(entry) == 3:
            entry.append("withdrawn")


def settle(e: Engine) -> None:
    keep = []
    for entry in e.owing:
        th, name, uid = entry[0], entry[1], entry[2]
        if e.status != "running":
            e.answers.append((uid, "ended", name, None))
        elif not th.alive:
            if e.cancelling or e.failing is not None:
                keep.append(entry)
            elif len(entry) > 3:
                e.answers.append((uid, "withdrawn", name, None))
            else:
                e.answers.append((uid, "answer", name, None))
        elif th.park == "" or reply_ahead(e, th, name):
            keep.append(entry)
        else:
            e.answers.append((uid, "answer", name, None))
    e.owing = keep


def reply_ahead(e: Engine, th: Thread, name: str) -> bool:
    """Whether a reply step of `name` is ahead of the parked thread `th` on its own way (see the module)."""
    found, goes_on = _parked_at(e, th, name)
    if found:
        return True
    if goes_on:
        found, goes_on = _code(e, reversed(th.stack), name)
    block = th.block
    while not found and goes_on:
        if isinstance(block, Pass):
            if block.role == "loop":  # it may go round again
                found = _ahead(e, block.term.body, name, set())[0]
            k = block.then if block.role == "handler" else block.k
        elif isinstance(block, Interleave):  # the same thread runs the other branches, then goes on after
            others = [b for i, b in enumerate(block.term.branches) if i != block.current]
            found = any(_ahead(e, b, name, set())[0] for b in others)
            k = block.k
        else:  # the end of a branch of a split, of an mi instance, of undoing, of the workflow
            return found
        if not found:
            found, goes_on = _code(e, reversed(k), name)
        block = block.parent
    return found


def _parked_at(e: Engine, th: Thread, name: str) -> tuple[bool, bool]:
    """What is ahead inside the step the thread is parked at (a lock's section, a milestone's branch, a blocked
    par, a deferred choice's branches), and whether it goes on past it."""
    if th.park in ("lock", "milestone", "blocked") or (th.park == "signal" and not isinstance(th.at[0], Wait)):
        return _ahead(e, th.at[0], name, set())
    return False, True


def _code(e: Engine, items: Any, name: str) -> tuple[bool, bool]:
    """A thread's remaining code (stack items, next first): whether a reply of `name` is ahead in it, and whether it
    can reach its end."""
    for item in items:
        if isinstance(item[0], str):  # a marker
            kind = item[0]
            if kind == "finally":
                found, ends = _ahead(e, item[1].finally_, name, set())
            elif kind == "loop_test":
                found, ends = _ahead(e, item[1].body, name, set())[0], True
            elif kind == "mi_spawn":
                found, ends = False, False
            else:
                found, ends = False, True
        else:
            found, ends = _ahead(e, item[0], name, set())
        if found or not ends:
            return found, ends
    return False, True


def _ahead(e: Engine, t: Any, name: str, calls: set[str]) -> tuple[bool, bool]:
    """(whether the thread entering `t` can reach a reply of `name` in it, whether it can come out at its end)."""
    kind = t.kind
    if kind == "reply":
        return t.name == name, True
    if kind == "terminate":
        return False, False
    if kind in ("seq", "saga"):
        for step in t.steps:
            action = step[0] if isinstance(step, tuple) else step
            found, ends = _ahead(e, action, name, calls)
            if found or not ends:
                return found, ends
        return False, True
    if kind == "par":
        return _ahead(e, t.branches[0], name, calls)[0], False
    if kind == "multi_choice":
        branches = [b for _, b in t.cases] + ([t.default] if t.default is not None else [])
        return any(_ahead(e, b, name, calls)[0] for b in branches), False
    if kind == "xor":
        return _any(e, [b for _, b in t.cases] + ([t.default] if t.default is not None else []), name, calls)
    if kind == "defer":
        return _any(e, [b for _, b in t.branches] + ([t.on_timeout] if t.on_timeout is not None else []), name,
                    calls)
    if kind == "loop":
        return _ahead(e, t.body, name, calls)[0], True
    if kind == "scope":
        found, ends = _ahead(e, t.body, name, calls)
        if found or not ends or t.finally_ is None:
            return found, ends
        return _ahead(e, t.finally_, name, calls)
    if kind in ("critical", "milestone"):
        return _ahead(e, t.body, name, calls)
    if kind == "when_milestone":
        return _ahead(e, t.branch, name, calls)
    if kind == "interleave":
        return any(_ahead(e, b, name, calls)[0] for b in t.branches), True
    if kind == "mi":
        return False, t.join is None
    if kind == "call":
        if t.name in calls:  # a call of a workflow being looked into: nothing more is found there
            return False, False
        return _ahead(e, e.library[t.name], name, calls | {t.name})
    return False, True  # a task, an effect, a wait, a sleep, a region step


def _any(e: Engine, branches: list[Any], name: str, calls: set[str]) -> tuple[bool, bool]:
    found, ends = False, False
    for b in branches:
        f, d = _ahead(e, b, name, calls)
        found, ends = found or f, ends or d
    return found, ends

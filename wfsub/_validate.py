"""Static checks of a term: `validate(term) -> list[ValidationIssue]`. Never raises on a bad term.

One check per term kind, named `_check_<kind>`; the table is built from the term classes by that name.
Each issue names the node by its path (`seq[1].par[0].mi`: the `mi` that is branch 0 of the `par` that is
step 1 of the root `seq`) and says how to fix it. `compile_workflow` runs these checks and raises
`InvalidWorkflow` carrying all of them.
"""

from __future__ import annotations

import inspect
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FunctionType
from typing import Any

from pydantic import BaseModel, ConfigDict

from . import _netgraph
from ._terms import (
    MAX_SECONDS,
    MI,
    AddInstances,
    Call,
    CancelRegion,
    CloseInstances,
    CompleteRegion,
    Critical,
    Defer,
    Effect,
    Interleave,
    Loop,
    Milestone,
    MultiChoice,
    Net,
    Par,
    Reply,
    Retry,
    Saga,
    Scope,
    Seq,
    SignalCase,
    Sleep,
    StartCase,
    Task,
    Term,
    Terminate,
    Wait,
    WhenMilestone,
    Xor,
    branch_name,
    by_kind,
    child_path,
    children,
)


class ValidationIssue(BaseModel):
    """One problem with a workflow term: where it is and what to do about it."""

    model_config = ConfigDict(frozen=True)

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _is_async(fn: object) -> bool:
    if type(fn) is FunctionType and "_is_coroutine_marker" not in fn.__dict__:  # the common case, without inspect
        return bool(fn.__code__.co_flags & inspect.CO_COROUTINE)
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _name_of(fn: object) -> str:
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


MAX_DEPTH = 100
"""How deeply terms may nest in one workflow (nested seqs are spliced by `seq`, so they never count)."""


@dataclass
class _CaseWide:
    """What spans every workflow a case can run (the root and the library workflows it calls)."""

    milestones: set[str] = field(default_factory=set)
    whens: list[tuple[str, str]] = field(default_factory=list)  # (milestone name, path of when_milestone)
    regions: dict[str, list[tuple[str, str, object]]] = field(default_factory=dict)  # name -> (path, kind, dynamic)
    models: dict[str, tuple[type, str]] = field(default_factory=dict)  # signal name -> (payload model, first path)
    steps: list[tuple[str, str, str, str]] = field(default_factory=list)  # (kind, region, path, context suffix)


@dataclass
class _Checker:
    """Checks one workflow: the root, or one library workflow reached through `call`."""

    library: Mapping[str, Any] | None
    issues: list[ValidationIssue]
    case: _CaseWide
    context: str = ""  # appended to every message: which library workflow, called from where
    regions: dict[str, tuple[str, str]] = field(default_factory=dict)  # region name -> (scope|mi, first path)
    held: list[str] = field(default_factory=list)  # names of the critical sections around the current node
    calls: list[tuple[str, str]] = field(default_factory=list)  # (library name, path of the call)
    handlers: int = 0  # how many on_cancel / on_error / compensation branches enclose the current node
    handler_calls: list[tuple[str, str]] = field(default_factory=list)  # calls made inside such a branch
    terminates: str | None = None  # the path of a terminate() in this workflow, if it has one
    loops: int = 0  # how many loops enclose the current node
    on_error: bool = True  # the workflow has an on_error scope (set by _survey; parallel error keys are checked)
    waited: set[str] = field(default_factory=set)  # signal names a wait or defer takes, seen so far in code order

    def add(self, path: str, message: str) -> None:
        self.issues.append(ValidationIssue(path=path, message=message + self.context))

    def callable_(self, path: str, what: str, value: object) -> None:
        if not callable(value):
            self.add(path, f"{what} must be a function, got {value!r}: pass a function of ctx")

    def region(self, path: str, name: object, what: str, dynamic: object = False) -> None:
        """Declare a region. Scopes may share a name (one region in several parts); an mi's name is its own."""
        if not isinstance(name, str) or not name:
            self.add(path, f"{what} name must be a non-empty str, got {name!r}")
            return
        first = self.regions.get(name)
        if first is None:
            self.regions[name] = (what, path)
        else:
            first_what, first_path = first
            if what == "mi" or first_what == "mi":
                self.add(
                    path,
                    f"region name {name!r} is already used at {first_path}: an mi's name must be its own "
                    "(add_instances must know which mi); only scopes may share a name",
                )
        self.case.regions.setdefault(name, []).append((path, what, dynamic))

    def join(self, path: str, join: object, branches: int | None, allowed: tuple[object, ...]) -> None:
        if _is_int(join):
            assert isinstance(join, int)
            if join < 1:
                self.add(path, f"join={join} must be at least 1: use an int n >= 1, 'first' or 'all'")
            elif branches is not None and join > branches:
                self.add(path, f"join={join} exceeds the {branches} branches: it could never fire; use n <= {branches}")
        elif join not in allowed:
            names = ", ".join(repr(a) for a in allowed)
            self.add(path, f"join={join!r} is not a join policy: use {names} or an int n >= 1")

    def walk(self, term: object, path: str) -> None:
        if not isinstance(term, Term):
            hint = ""
            if callable(term):
                hint = f": wrap it as task({_name_of(term)}) or effect({_name_of(term)})"
            self.add(path, f"expected a workflow term, got {term!r}{hint}")
            return
        _CHECKS[type(term)](self, term, path)
        held = isinstance(term, Critical) and isinstance(term.name, str)
        if held:
            assert isinstance(term, Critical)
            if term.name in self.held:
                self.add(
                    path,
                    f"critical({term.name!r}) inside a critical section of the same name: sections are not "
                    "reentrant, so it would wait for itself forever; rename one of them or merge the two",
                )
            self.held.append(term.name)
        elif isinstance(term, Milestone) and isinstance(term.name, str):
            self.case.milestones.add(term.name)
        elif isinstance(term, WhenMilestone) and isinstance(term.name, str):
            self.case.whens.append((term.name, path))
        split = isinstance(term, _SPLITS)  # its children run as threads of their own
        before = set(self.waited) if split else None
        looped = isinstance(term, Loop)
        self.loops += looped
        for selector, child in children(term):
            handler = selector in ("on_cancel", "on_error", "finally") or selector.endswith(".compensation")
            self.handlers += handler
            outer = set(self.waited) if split or handler else None
            self.walk(child, child_path(path, selector, child))
            self.handlers -= handler
            if outer is not None:  # a wait in another thread answers no reply of this one
                self.waited = outer
        self.loops -= looped
        if before is not None:  # the threads a split started end at its join: their updates are answered there
            self.waited = before
        if held:
            self.held.pop()



# The walks below visit whole subtrees but rarely report: they carry a link (parent link, selector, node) and
# spell a node's path only when it is reported, instead of formatting every path on the way.
_Link = tuple[Any, str, object] | None


def _path_of(link: _Link, root: str) -> str:
    steps: list[tuple[str, object]] = []
    while link is not None:
        link, sel, node = link
        steps.append((sel, node))
    path = root
    for sel, node in reversed(steps):
        path = child_path(path, sel, node)
    return path


def _survey(term: object, root: str) -> tuple[str | None, bool]:
    """One iterative walk (any depth) before the checks: the path of the first node nested deeper than MAX_DEPTH
    (or None), and whether the workflow has an on_error scope at all (else no branch needs its keys compared)."""
    stack: list[tuple[object, _Link, int]] = [(term, None, 1)]
    on_error = False
    while stack:
        node, link, depth = stack.pop()
        if depth > MAX_DEPTH:
            return _path_of(link, root), on_error
        if isinstance(node, Term):
            if isinstance(node, Scope) and node.on_error is not None:
                on_error = True
            for sel, child in children(node):
                stack.append((child, (link, sel, child), depth + 1))
    return None, on_error


def _check_workflow(checker: _Checker, term: object, root: str) -> None:
    deep, checker.on_error = _survey(term, root)
    if deep is not None:
        checker.add(
            deep,
            f"the workflow nests terms more than {MAX_DEPTH} deep here: flatten it (seq(*steps) rather than "
            "nested blocks) or split it into workflows joined by call()",
        )
        return
    checker.walk(term, root)


def _check_task(c: _Checker, t: Task, path: str) -> None:
    if not callable(t.fn):
        c.add(path, f"task needs a function, got {t.fn!r}")
    elif _is_async(t.fn):
        name = _name_of(t.fn)
        c.add(path, f"task({name}) is given a coroutine function: use effect({name}) for async steps")
    if t.name is not None and not isinstance(t.name, str):
        c.add(path, f"name must be a str, got {t.name!r}")


def _check_effect(c: _Checker, t: Effect, path: str) -> None:
    if not callable(t.fn):
        c.add(path, f"effect needs an async function, got {t.fn!r}")
    elif not _is_async(t.fn):
        c.add(
            path,
            f"effect({_name_of(t.fn)}) is given a plain function: define it with `async def`, "
            "or use task() for a pure step",
        )
    if t.name is not None and not isinstance(t.name, str):
        c.add(path, f"name must be a str, got {t.name!r}")
    if t.timeout is not None and (not _is_number(t.timeout) or t.timeout <= 0):
        c.add(path, f"timeout={t.timeout!r} must be a positive number of seconds, or None for no timeout")
    else:
        _at_most_max_seconds(c, path, "timeout", t.timeout)
    if t.retry is not None:
        _check_retry(c, t.retry, path)
    if t.heartbeat_timeout is not None:
        if not _is_number(t.heartbeat_timeout) or t.heartbeat_timeout <= 0:
            c.add(
                path,
                f"heartbeat_timeout={t.heartbeat_timeout!r} must be a positive number of seconds (the longest an "
                "attempt may go without calling wfsub.heartbeat()), or None for no heartbeat timeout",
            )
        else:
            _at_most_max_seconds(c, path, "heartbeat_timeout", t.heartbeat_timeout)


def _check_retry(c: _Checker, r: object, path: str) -> None:
    """Every problem of a retry policy, each with the value given and what to write instead."""
    if not isinstance(r, Retry):
        c.add(path, f"retry must be Retry(...), got {r!r}")
        return
    if r.max_attempts is not None and (not _is_int(r.max_attempts) or r.max_attempts < 1):
        c.add(path, f"Retry.max_attempts={r.max_attempts!r} must be an int >= 1, or None to retry without a count "
                    "limit")
    bad = [name for name in ("initial", "multiplier", "max_interval") if not (
        _is_number(getattr(r, name)) and getattr(r, name) >= 0)]
    if bad:
        shown = ", ".join(f"{name}={getattr(r, name)!r}" for name in bad)
        c.add(path, f"Retry {shown}: initial, multiplier and max_interval must be non-negative finite numbers")
    elif r.max_interval > MAX_SECONDS:
        c.add(path, f"Retry.max_interval={r.max_interval!r} is more than {MAX_SECONDS:g} seconds (about 31 years)")
    elif r.initial > r.max_interval:  # every wait would be cut to max_interval without a word
        c.add(path, f"Retry(initial={r.initial!r}) is above max_interval={r.max_interval!r}, which caps every wait "
                    "between attempts (30 s unless given): the first retry would wait max_interval, not initial; "
                    f"give max_interval >= {r.initial!r}, or a smaller initial")
    if r.max_elapsed is not None:
        if not _is_number(r.max_elapsed) or r.max_elapsed <= 0:
            c.add(path, f"Retry.max_elapsed={r.max_elapsed!r} must be a positive number of seconds, or None for no "
                        "time limit")
        else:
            _at_most_max_seconds(c, path, "Retry.max_elapsed", r.max_elapsed)
    if r.max_attempts is None and not bad and r.initial == 0 and r.max_elapsed is None:
        c.add(path, "Retry(max_attempts=None, initial=0) would retry a failing effect forever without a pause: "
                    "give initial > 0 (a backoff), max_elapsed=seconds, or a max_attempts count")
    if not (
        isinstance(r.non_retryable, tuple)
        and all(isinstance(e, type) and issubclass(e, BaseException) for e in r.non_retryable)
    ):
        c.add(path, f"Retry.non_retryable must be a tuple of exception classes, got {r.non_retryable!r}")


def _nonempty(c: _Checker, items: object, path: str, what: str) -> bool:
    if not isinstance(items, tuple) or not items:
        c.add(path, f"{what} needs at least one branch")
        return False
    return True


def _check_seq(c: _Checker, t: Seq, path: str) -> None:
    _nonempty(c, t.steps, path, "seq")


def _check_par(c: _Checker, t: Par, path: str) -> None:
    if _nonempty(c, t.branches, path, "par"):
        c.join(path, t.join, len(t.branches), ("all", "first", "each"))
        _distinct_error_keys(c, [(str(i), b) for i, b in enumerate(t.branches)], path)
    if not isinstance(t.cancel_remaining, bool):
        c.add(path, f"cancel_remaining must be True or False, got {t.cancel_remaining!r}")
    if not isinstance(t.blocking, bool):
        c.add(path, f"blocking must be True or False, got {t.blocking!r}")
    elif t.blocking and not (t.join == "first" or _is_int(t.join)):
        c.add(path, f"blocking=True needs join='first' or an int n (got join={t.join!r}): only those joins fire early")
    elif t.blocking and t.cancel_remaining:
        c.add(path, "blocking=True and cancel_remaining=True exclude each other: with cancel_remaining nothing is "
              "left to wait for; drop one of them")


def _error_keys(term: object, path: str) -> list[tuple[str, str]]:
    """(error_into, path) of the on_error scopes in a branch, not looking into mi bodies (instance data)."""
    found: list[tuple[str, str]] = []
    stack: list[tuple[object, _Link]] = [(term, None)]
    while stack:
        node, link = stack.pop()
        if not isinstance(node, Term) or isinstance(node, MI):
            continue
        if isinstance(node, Scope) and node.on_error is not None and isinstance(node.error_into, str):
            found.append((node.error_into, _path_of(link, path)))
        stack.extend((child, (link, sel, child)) for sel, child in children(node))
    return found


def _distinct_error_keys(c: _Checker, branches: Sequence[tuple[str, Any]], path: str) -> None:
    """Parallel branches share the case data: two on_error scopes in two of them must store under two keys.
    `branches` are (selector, term) pairs of the branches that may run at the same time."""
    if not c.on_error:
        return
    seen: dict[str, str] = {}
    for sel, branch in branches:
        mine: dict[str, str] = {}
        for key, where in _error_keys(branch, child_path(path, sel, branch)):
            if key in seen:
                c.add(
                    where,
                    f"error_into={key!r} is also used by the on_error scope at {seen[key]}, in a parallel branch: "
                    "both would store their error record at the same key; give each its own error_into",
                )
            mine.setdefault(key, where)
        for key, where in mine.items():
            seen.setdefault(key, where)


def _check_xor(c: _Checker, t: Xor, path: str) -> None:
    _check_cases(c, t, path)


def _check_multi_choice(c: _Checker, t: MultiChoice, path: str) -> None:
    _check_cases(c, t, path)
    if isinstance(t.cases, tuple):  # every branch whose predicate holds runs at once (the default runs alone)
        _distinct_error_keys(c, [(sel, b) for sel, b in children(t) if sel != "default"], path)


def _check_cases(c: _Checker, t: Xor | MultiChoice, path: str) -> None:
    if not t.cases and t.default is None:
        c.add(path, f"{t.kind} needs at least one (predicate, branch) pair")
    for i, case in enumerate(t.cases):
        if not (isinstance(case, tuple) and len(case) == 2):
            c.add(f"{path}[{i}]", f"expected a (predicate, branch) pair, got {case!r}")
        else:
            c.callable_(f"{path}[{i}]", "predicate", case[0])


def _check_loop(c: _Checker, t: Loop, path: str) -> None:
    given = [n for n, v in (("while_", t.while_), ("until", t.until), ("times", t.times)) if v is not None]
    if len(given) != 1:
        found = "none" if not given else " and ".join(given)
        c.add(path, f"loop needs exactly one of while_=, until=, times= (got {found})")
    if t.while_ is not None:
        c.callable_(path, "while_", t.while_)
    if t.until is not None:
        c.callable_(path, "until", t.until)
    if t.times is not None and (not _is_int(t.times) or t.times < 0):
        c.add(path, f"times={t.times!r} must be an int >= 0")
    if t.max_iterations is not None and (not _is_int(t.max_iterations) or t.max_iterations < 1):
        c.add(path, f"max_iterations={t.max_iterations!r} must be an int >= 1, or None for no limit")


def _check_wait(c: _Checker, t: Wait, path: str) -> None:
    if not isinstance(t.signal, str) or not t.signal:
        c.add(path, f"signal name must be a non-empty str, got {t.signal!r}")
    if t.into is not None and not isinstance(t.into, str):
        c.add(path, f"into must be a str key, got {t.into!r}")
    if callable(t.timeout):
        _timer_fn(c, path, "timeout", t.timeout)
    elif t.timeout is not None and (not _is_number(t.timeout) or t.timeout <= 0):
        c.add(path, f"timeout={t.timeout!r} must be a positive number of seconds (or a function of ctx returning "
                    "one), or None to wait without limit")
    else:
        _at_most_max_seconds(c, path, "timeout", t.timeout)
    _check_deadline(c, path, t.timeout, t.deadline)
    if t.model is not None:
        _signal_model(c, path, t.signal, t.model)
    if isinstance(t.signal, str):
        c.waited.add(t.signal)
    if t.reply is not None and not callable(t.reply):
        c.add(path, f"reply={t.reply!r} must be a function of ctx returning the update's answer (a JSON value)")
    if t.check is not None:
        _check_fn(c, path, "check", t.check)


def _signal_model(c: _Checker, path: str, signal: object, model: object) -> None:
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        c.add(path, f"model must be a pydantic model class (a BaseModel subclass), got {model!r}")
    elif isinstance(signal, str):
        first = c.case.models.setdefault(signal, (model, path))
        if first[0] is not model:
            c.add(
                path,
                f"signal {signal!r} is given model {model.__name__} here and {first[0].__name__} at "
                f"{first[1]}: a signal's payload is validated once, when sent; use one model per signal name",
            )


def _check_fn(c: _Checker, path: str, what: str, fn: object) -> None:
    if not callable(fn):
        c.add(path, f"{what}={fn!r} must be a function (ctx, payload) -> None or a refusal str")


def _per_signal(c: _Checker, t: Defer, path: str, what: str) -> list[tuple[str, Any]]:
    """The {signal: value} pairs of defer's model= or check=, each naming one of its branches."""
    value = getattr(t, what)
    if value is None:
        return []
    names = {pair[0] for pair in t.branches if isinstance(pair, tuple) and len(pair) == 2} \
        if isinstance(t.branches, tuple) else set()
    if not isinstance(value, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in value):
        c.add(path, f"{what}= must be a dict {{signal name: ...}}, got {value!r}")
        return []
    good = []
    for name, item in value:
        if name not in names:
            known = ", ".join(repr(n) for n in sorted(names, key=str)) or "none"
            c.add(path, f"{what}= names signal {name!r}, which is not one of this defer's branches ({known}): "
                        "check the name")
        else:
            good.append((name, item))
    return good


def _check_defer(c: _Checker, t: Defer, path: str) -> None:
    if not isinstance(t.branches, tuple) or not t.branches:
        c.add(path, "defer needs at least one {signal: branch} entry (for a timeout alone, use sleep() then the step)")
    else:
        for pair in t.branches:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and pair[0]):
                c.add(path, f"defer keys must be non-empty signal names, got {pair!r}")
    if (t.timeout is None and t.deadline is None) != (t.on_timeout is None):
        missing = "on_timeout=" if t.on_timeout is None else "timeout= (or deadline=)"
        c.add(path, f"timeout (or deadline) and on_timeout go together: add {missing}")
    _check_deadline(c, path, t.timeout, t.deadline)
    if callable(t.timeout):
        _timer_fn(c, path, "timeout", t.timeout)
    elif t.timeout is not None and (not _is_number(t.timeout) or t.timeout < 0):
        c.add(path, f"timeout={t.timeout!r} must be a non-negative number of seconds (or a function of ctx "
                    "returning one)")
    else:
        _at_most_max_seconds(c, path, "timeout", t.timeout)
    for name, model in _per_signal(c, t, path, "model"):
        _signal_model(c, path, name, model)
    for name, fn in _per_signal(c, t, path, "check"):
        _check_fn(c, path, f"check[{name!r}]", fn)
    if isinstance(t.branches, tuple):
        c.waited.update(p[0] for p in t.branches if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str))


_SPLITS = (Par, MI, Interleave, MultiChoice, Net)
"""Terms whose children run as threads of their own: a `reply` answers only what a wait of its own thread took."""


def _check_reply(c: _Checker, t: Reply, path: str) -> None:
    if not isinstance(t.name, str) or not t.name:
        c.add(path, f"reply needs the update's name (a non-empty str), got {t.name!r}")
    elif t.name not in c.waited:
        c.add(path, f"reply({t.name!r}) answers an update no earlier wait of its thread takes (a wait in another "
                    f"branch of a par, mi or net does not count): put wait({t.name!r}) before it in the same thread, "
                    "or fix the name")
    if not callable(t.fn):
        c.add(path, f"reply fn must be a function of ctx returning the update's answer (a JSON value), got {t.fn!r}")


def _check_sleep(c: _Checker, t: Sleep, path: str) -> None:
    if t.until is not None:
        if t.seconds is not None:
            c.add(path, f"sleep takes seconds or until=, not both (got {t.seconds!r} and until={t.until!r}): "
                        "keep the one that says when the timer falls due")
        if callable(t.until):
            _timer_fn(c, path, "until", t.until)
        else:
            c.add(path, f"until={t.until!r} must be a function of ctx returning epoch seconds or an ISO 8601 time with "
                        "a timezone (for a fixed length, use sleep(seconds))")
    elif t.seconds is None:
        c.add(path, "sleep needs seconds (a number, or a function of ctx returning one) or until= (a function of ctx "
                    "returning epoch seconds or an ISO 8601 time with a timezone)")
    elif callable(t.seconds):
        _timer_fn(c, path, "seconds", t.seconds)
    elif not _is_number(t.seconds) or t.seconds < 0:
        c.add(path, f"sleep seconds={t.seconds!r} must be a non-negative number, or a function of ctx returning one")
    else:
        _at_most_max_seconds(c, path, "sleep seconds", t.seconds)


def _check_deadline(c: _Checker, path: str, timeout: object, deadline: object) -> None:
    """`deadline=` of a wait or defer: a function of ctx giving a point in time, instead of `timeout=`."""
    if deadline is None:
        return
    if timeout is not None:
        c.add(path, f"give timeout= or deadline=, not both (got {timeout!r} and deadline={deadline!r}): timeout= "
                    "is a length from when the step starts, deadline= the time it gives up at")
    if callable(deadline):
        _timer_fn(c, path, "deadline", deadline)
    else:
        c.add(path, f"deadline={deadline!r} must be a function of ctx returning epoch seconds or an ISO 8601 time "
                    "with a timezone (for a fixed length, use timeout=seconds)")


def _timer_fn(c: _Checker, path: str, what: str, fn: object) -> None:
    """A timer computed from the data: the vm calls it synchronously when the step starts."""
    if _is_async(fn):
        c.add(path, f"{what}={_name_of(fn)} is an async function: the vm computes a timer from the case data "
                    "synchronously when the step starts; use a plain function (fetch what it needs with an effect "
                    "before the step)")


def _at_most_max_seconds(c: _Checker, path: str, what: str, seconds: float | None) -> None:
    if seconds is not None and seconds > MAX_SECONDS:
        c.add(
            path,
            f"{what}={seconds!r} is longer than the longest timer wfsub arms ({MAX_SECONDS:g} s, about 31 years): "
            "for a wait without end use wait() or leave the timeout out",
        )


def _check_scope(c: _Checker, t: Scope, path: str) -> None:
    c.region(path, t.name, "scope")
    if t.on_error is not None and (not isinstance(t.error_into, str) or not t.error_into):
        c.add(path, f"error_into must be a non-empty str key (where the error record goes), got {t.error_into!r}")


def _check_saga(c: _Checker, t: Saga, path: str) -> None:
    if not isinstance(t.steps, tuple) or not t.steps:
        c.add(path, "saga needs at least one step (an action, or an (action, compensation) pair)")
        return
    for i, step in enumerate(t.steps):
        if isinstance(step, tuple) and len(step) != 2:
            c.add(f"{path}[{i}]", f"a saga step is an action or an (action, compensation) pair, got {len(step)} items")


def _check_mi(c: _Checker, t: MI, path: str) -> None:
    if (t.count is None) == (t.items is None):
        c.add(path, "mi needs exactly one of count= (int or function) and items= (function)")
    fixed: int | None = None
    if t.count is not None:
        if _is_int(t.count):
            fixed = t.count
            if t.count < 0:
                c.add(path, f"count={t.count} must be >= 0")
        elif not callable(t.count):
            c.add(path, f"count must be an int or a function of ctx, got {t.count!r}")
    if t.items is not None:
        c.callable_(path, "items", t.items)
    for label, bound in (("min", t.min), ("max", t.max)):
        if bound is not None and (not _is_int(bound) or bound < 0):
            c.add(path, f"{label}={bound!r} must be an int >= 0")
    if _is_int(t.min) and _is_int(t.max) and t.min > t.max:
        c.add(path, f"min={t.min} is greater than max={t.max}: no instance count satisfies both")
    if fixed is not None and fixed >= 0:
        if _is_int(t.min) and fixed < t.min:
            c.add(path, f"count={fixed} is below min={t.min}")
        if _is_int(t.max) and fixed > t.max:
            c.add(path, f"count={fixed} is above max={t.max}")
    c.join(path, t.join, None if t.dynamic else fixed, ("all", "first", None))
    if t.until is not None:
        c.callable_(path, "until", t.until)
    if t.collect is not None:
        if not isinstance(t.collect, str) or not t.collect:
            c.add(path, f"collect must be a non-empty str key, got {t.collect!r}")
        elif t.join is None:
            c.add(path, "collect needs a join: with join=None nothing waits for the outputs")
    if t.name is not None:
        c.region(path, t.name, "mi", t.dynamic)
    elif t.dynamic:
        c.add(path, "a dynamic mi needs name=: add_instances addresses it by that name")
    if not (t.dynamic is False or t.dynamic is True or t.dynamic == "open"):
        c.add(path, f"dynamic={t.dynamic!r} must be False, True or \"open\"")
    if not isinstance(t.cancel_remaining, bool):
        c.add(path, f"cancel_remaining must be True or False, got {t.cancel_remaining!r}")


def _check_interleave(c: _Checker, t: Interleave, path: str) -> None:
    if not _nonempty(c, t.branches, path, "interleave"):
        return
    names: dict[str, int] = {}
    for i, b in enumerate(t.branches):
        n = branch_name(b)
        if n is not None:
            names.setdefault(n, i)
    if not isinstance(t.order, tuple):
        c.add(path, f"order must be a sequence of (before, after) pairs, got {t.order!r}")
        return
    edges: dict[int, set[int]] = {}
    for pair in t.order:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            c.add(path, f"order entry {pair!r} must be a (before, after) pair")
            continue
        ends = []
        for ref in pair:
            if _is_int(ref) and 0 <= ref < len(t.branches):
                ends.append(ref)
            elif isinstance(ref, str) and ref in names:
                ends.append(names[ref])
            else:
                known = ", ".join(sorted(names)) or "none"
                c.add(
                    path,
                    f"order names unknown branch {ref!r}: use an index 0..{len(t.branches) - 1} "
                    f"or a branch name ({known})",
                )
        if len(ends) == 2:
            edges.setdefault(ends[0], set()).add(ends[1])
    if _has_cycle(edges):
        c.add(path, "order forms a cycle: no branch could go first; remove one of the pairs in the cycle")


def _has_cycle(edges: dict[int, set[int]]) -> bool:
    state: dict[int, int] = {}

    def visit(n: int) -> bool:
        state[n] = 1
        for m in edges.get(n, ()):
            s = state.get(m, 0)
            if s == 1 or (s == 0 and visit(m)):
                return True
        state[n] = 2
        return False

    return any(state.get(n, 0) == 0 and visit(n) for n in list(edges))


def _check_named(c: _Checker, t: Critical | Milestone | WhenMilestone, path: str) -> None:
    if not isinstance(t.name, str) or not t.name:
        c.add(path, f"{t.kind} name must be a non-empty str, got {t.name!r}")


def _check_critical(c: _Checker, t: Critical, path: str) -> None:
    _check_named(c, t, path)


def _check_milestone(c: _Checker, t: Milestone, path: str) -> None:
    _check_named(c, t, path)


def _check_when_milestone(c: _Checker, t: WhenMilestone, path: str) -> None:
    _check_named(c, t, path)


def _check_terminate(c: _Checker, t: Terminate, path: str) -> None:
    if c.terminates is None:
        c.terminates = path
    if c.handlers:
        c.add(
            path,
            "terminate() inside an on_cancel, on_error, finally_ or compensation branch: those branches clean up after "
            "withdrawn work and must run to their end; end the case after the scope instead",
        )


def _check_region_step(c: _Checker, t: Any, path: str) -> None:
    if not isinstance(t.name, str) or not t.name:
        c.add(path, f"{t.kind} needs a region name (a non-empty str), got {t.name!r}")
    else:
        c.case.steps.append((t.kind, t.name, path, c.context))


def _check_cancel_region(c: _Checker, t: CancelRegion, path: str) -> None:
    _check_region_step(c, t, path)


def _check_complete_region(c: _Checker, t: CompleteRegion, path: str) -> None:
    _check_region_step(c, t, path)


def _check_add_instances(c: _Checker, t: AddInstances, path: str) -> None:
    _check_region_step(c, t, path)
    c.callable_(path, "items", t.items)


def _check_close_instances(c: _Checker, t: CloseInstances, path: str) -> None:
    _check_region_step(c, t, path)


def _check_region_steps(case: _CaseWide, issues: list[ValidationIssue]) -> None:
    """Each region step names a region the workflow declares, of the kind the step needs."""
    for kind, name, path, context in case.steps:
        parts = case.regions.get(name)
        if parts is None:
            known = ", ".join(sorted(case.regions)) or "none"
            message = f"{kind}({name!r}) names no region of the workflow (regions: {known}): check the name"
        elif kind in ("add_instances", "close_instances") and not any(
            what == "mi" and dynamic for _, what, dynamic in parts
        ):
            where = ", ".join(f"{what} at {at}" for at, what, _ in parts)
            message = (
                f"{kind}({name!r}) needs a dynamic mi, but region {name!r} is a {where}: "
                "build it with mi(..., dynamic=True, name=...)"
            )
        else:
            continue
        issues.append(ValidationIssue(path=path, message=message + context))


def _check_call(c: _Checker, t: Call, path: str) -> None:
    if not isinstance(t.name, str):
        c.add(path, f"call name must be a str, got {t.name!r}")
    elif c.library is None:
        entry = f"{{{t.name!r}: workflow}}"
        c.add(
            path,
            f"call({t.name!r}) needs a library: pass Substrate(workflows={entry}), "
            f"or library={entry} to compile or validate",
        )
    elif t.name not in c.library:
        known = ", ".join(sorted(str(k) for k in c.library)) or "empty"
        c.add(
            path,
            f"call({t.name!r}): no workflow of that name in the library ({known}): "
            "register it in workflows= / library=, or check the spelling",
        )
    else:
        c.calls.append((t.name, path))
        if c.handlers:
            c.handler_calls.append((t.name, path))


def _check_start_case(c: _Checker, t: StartCase, path: str) -> None:
    if not isinstance(t.workflow, str) or not t.workflow:
        c.add(path, f"start_case needs the registered name of a workflow (a non-empty str), got {t.workflow!r}")
    elif c.library is None:
        entry = f"{{{t.workflow!r}: workflow}}"
        c.add(
            path,
            f"start_case({t.workflow!r}) starts a registered workflow: pass Substrate(workflows={entry}), "
            f"or library={entry} to compile or validate",
        )
    elif t.workflow not in c.library:
        known = ", ".join(sorted(str(k) for k in c.library)) or "none"
        c.add(
            path,
            f"start_case({t.workflow!r}): no workflow of that name is registered (registered: {known}): "
            "register it in workflows=, or check the spelling",
        )
    if t.data is not None:
        c.callable_(path, "start_case data=", t.data)
    if t.case_id is not None:
        c.callable_(path, "start_case case_id=", t.case_id)
    elif c.loops:
        c.add(
            path,
            f"start_case({t.workflow!r}) inside a loop has no case_id=: every iteration would find the first "
            "iteration's child (its default id is its node path); pass case_id=fn giving each run its own id, "
            "e.g. case_id=lambda c: f\"{c['order']}-{c['attempt']}\"",
        )
    if not isinstance(t.wait, bool):
        c.add(path, f"start_case wait= must be True (wait for the child's end) or False (go on), got {t.wait!r}")
    if t.into is not None and (not isinstance(t.into, str) or not t.into):
        c.add(path, f"start_case into= must be a non-empty str (a key of the data) or None, got {t.into!r}")
    if t.queue is not None and (not isinstance(t.queue, str) or not t.queue):
        c.add(path, f"start_case queue= must be the name of a queue (a non-empty str) or None, got {t.queue!r}")
    if t.priority is not None and (isinstance(t.priority, bool) or not isinstance(t.priority, int)):
        c.add(path, f"start_case priority= must be an int (lower starts first) or None, got {t.priority!r}")
    if t.dedup is not None and (not isinstance(t.dedup, str) or not t.dedup):
        c.add(path, f"start_case dedup= must be a non-empty str or None, got {t.dedup!r}")
    if t.queue is None and (t.priority is not None or t.dedup is not None):
        c.add(path, f"start_case({t.workflow!r}): priority= and dedup= apply to a child started through a queue: "
                    "pass queue='name' too")
    if t.on_parent_cancel not in ("cancel", "abandon"):
        c.add(
            path,
            f"start_case on_parent_cancel={t.on_parent_cancel!r} is not a policy: use 'cancel' (the child is "
            "cancelled with the parent) or 'abandon' (it runs on)",
        )


def _check_signal_case(c: _Checker, t: SignalCase, path: str) -> None:
    if not isinstance(t.name, str) or not t.name:
        c.add(path, f"signal_case needs a signal name (a non-empty str), got {t.name!r}")
    if t.case_id is None or not callable(t.case_id):
        c.add(
            path,
            f"signal_case case_id= must be a function of ctx returning the id of the case to signal, got "
            f"{t.case_id!r}: e.g. case_id=lambda ctx: ctx['order_id']",
        )
    if t.payload is not None:
        c.callable_(path, "signal_case payload=", t.payload)


def _net_runs_nodes_at_once(t: Net) -> bool:
    """Whether some node of the net splits into parallel threads (an and or or split with two edges or more)."""
    if not isinstance(t.edges, tuple):
        return False
    kinds = dict(t.split) if isinstance(t.split, tuple) else {}
    out: dict[object, int] = {}
    for edge in t.edges:
        if isinstance(edge, tuple) and len(edge) >= 2:
            out[edge[0]] = out.get(edge[0], 0) + 1
    return any(n > 1 and kinds.get(src, "and") in ("and", "or") for src, n in out.items())


def _check_net(c: _Checker, t: Net, path: str) -> None:
    """The graph's own problems (see `_netgraph.check`), each at the node it is about or at the net."""
    terms = dict(pair for pair in t.nodes if isinstance(pair, tuple) and len(pair) == 2) if isinstance(
        t.nodes, tuple
    ) else {}
    for name, message in _netgraph.check(t):
        c.add(path if name is None else child_path(path, name, terms.get(name)), message)
    if _net_runs_nodes_at_once(t):
        _distinct_error_keys(c, list(terms.items()), path)


_CHECKS: dict[type[Term], Callable[[_Checker, Any, str], None]] = by_kind(globals(), "_check_", "validation")


def validate(term: object, *, library: Mapping[str, Any] | None = None) -> list[ValidationIssue]:
    """Every problem with `term` and with the library workflows it can reach through `call`, with node paths.

    Each workflow is checked on its own (region names are scoped to the workflow that declares them); a library
    workflow is checked only if the term can reach it, and its issues say which call reaches it. Milestone
    names span them all, as they do at run time.
    """
    issues: list[ValidationIssue] = []
    if library is not None and not isinstance(library, Mapping):
        message = f"library must be a mapping of name -> workflow, got {library!r}"
        issues.append(ValidationIssue(path="library", message=message))
        library = None
    issues.extend(
        ValidationIssue(path="library", message=f"library keys must be str names, got {key!r}")
        for key in library or {}
        if not isinstance(key, str)
    )
    case = _CaseWide()
    root = _Checker(library, issues, case)
    _check_workflow(root, term, term.kind if isinstance(term, Term) else "workflow")
    todo = deque(root.calls)
    checked: dict[str, _Checker] = {}
    while todo:
        name, at = todo.popleft()
        if name in checked:
            continue
        assert library is not None  # a recorded call names a library entry
        sub = library[name]
        checker = checked[name] = _Checker(
            library, issues, case, context=f" (in library workflow {name!r}, called at {at})"
        )
        _check_workflow(checker, sub, f"library[{name!r}].{sub.kind if isinstance(sub, Term) else '?'}")
        todo.extend(checker.calls)
    for checker in (root, *checked.values()):
        for name, at in checker.handler_calls:
            found = _terminate_reached(name, checked)
            if found is not None:
                checker.add(
                    at,
                    f"call({name!r}) inside an on_cancel, on_error, finally_ or compensation branch reaches "
                    f"terminate() (in library workflow {found[0]!r} at {found[1]}): those branches clean up after "
                    "withdrawn work and must run to their end; end the case after the scope instead",
                )
    _check_region_steps(case, issues)
    for name, path in case.whens:
        if name not in case.milestones:
            known = ", ".join(repr(n) for n in sorted(case.milestones)) or "none"
            issues.append(
                ValidationIssue(
                    path=path,
                    message=f"when_milestone({name!r}) names no milestone of the workflow (milestones: {known}): "
                    "it would wait forever; check the name",
                )
            )
    return issues


def _terminate_reached(name: str, checked: Mapping[str, _Checker]) -> tuple[str, str] | None:
    """The first library workflow (and path) with a terminate() that a call of `name` can reach, or None."""
    todo, seen = deque([name]), {name}
    while todo:
        current = todo.popleft()
        checker = checked.get(current)
        if checker is None:
            continue
        if checker.terminates is not None:
            return current, checker.terminates
        for callee, _ in checker.calls:
            if callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return None


__all__ = ["ValidationIssue", "validate"]

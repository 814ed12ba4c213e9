"""The pattern algebra: immutable, hashable terms, the functions that build them, and the tree helpers.

Constructors never raise on bad arguments: they record what they were given, and `validate` reports every
problem with its node path. That way one call shows the user all that is wrong with a workflow at once.
The hash of a term is computed once, when it is built (its children's hashes are already cached), so the
compile cache can look up a 10,000-node term in O(1).

Adding a construct `foo` touches one place per layer, each found by name:
    1. here: `class Foo(Term)` with `kind = "foo"`, its `_children`, and the constructor `foo(...)`;
    2. `_validate.py`: `_check_foo` (the table of checks is built from `term_classes()`: a missing check is
       an import error);
    3. `_program.py`: its opcode(s) `Op.FOO` and operand spec; `_compiler.py`: `_emit_foo`;
    4. `_vm/_ops.py`: the handler `_op_foo` for each new opcode, with its entry in the `HANDLERS` table (an
       opcode left out is an import error); `_vm/_records.py`: its frame class, if it opens one (snapshots
       find records by subclassing, nothing to register);
    5. the public exports (`wfsub/__init__.py`, `wfsub/terms.py`) and the differential tests' reference
       interpreter (`tests/core/reference/`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

MAX_SECONDS = 1e9
"""The longest timer, timeout or backoff wfsub accepts (about 31 years): past it, a number is a mistake. A due time
(`sleep(until=)`, `deadline=`) may be at most this far after the step starts, the one bound for both forms."""

JoinPolicy = str | int | None
"""`"all"`, `"first"`, an int n (n-of-m), `"each"` (par only) or None (mi only: no synchronization)."""


def _safe_hash(value: object) -> int:
    try:
        return hash(value)
    except TypeError:  # unhashable junk: validate reports it; identity keeps the term usable as a key
        return id(value)


class _Sub:
    """A value rendered in place by `_render` (a term or tuple whose text is built without recursion)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


def _parts(value: object) -> Iterator[str | _Sub]:
    if isinstance(value, Term):
        yield from value._repr_parts()
    elif isinstance(value, tuple):
        yield "("
        for i, item in enumerate(value):
            if i:
                yield ", "
            yield _Sub(item)
        yield ",)" if len(value) == 1 else ")"
    else:
        qualname = getattr(value, "__qualname__", None)
        yield qualname if callable(value) and isinstance(qualname, str) else repr(value)


def _render(value: object) -> str:
    """Render a value the way the code that built it would read; iterative, so any depth renders."""
    out: list[str] = []
    stack = [_parts(value)]
    while stack:
        for piece in stack[-1]:
            if isinstance(piece, _Sub):
                stack.append(_parts(piece.value))
                break
            out.append(piece)
        else:
            stack.pop()
    return "".join(out)


def _same(a: object, b: object) -> bool:
    """Equal and of the same type, all the way down (`join=True` is not `join=1`); iterative, any depth."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        if type(x) is not type(y):
            return False
        if isinstance(x, Term):
            assert isinstance(y, Term)
            if x._hash != y._hash:
                return False
            stack.extend((getattr(x, name), getattr(y, name)) for name in _field_names(type(x)))
        elif isinstance(x, tuple):
            assert isinstance(y, tuple)
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif x != y:
            return False
    return True


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls) if f.name != "_hash")
    return names


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Term:
    """Base of every node of the algebra."""

    kind: ClassVar[str] = "term"
    _positional: ClassVar[tuple[str, ...]] = ()
    # Fields a kind gained after its first release: the fingerprint's text leaves each out while it holds None, so a
    # workflow that does not use it keeps the fingerprint its stored cases recorded.
    _added: ClassVar[tuple[str, ...]] = ()
    _star: ClassVar[str | None] = None  # field shown as *args
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        values = tuple(getattr(self, name) for name in _field_names(type(self)))
        object.__setattr__(self, "_hash", hash((self.kind, tuple(_safe_hash(v) for v in values))))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not type(self) or hash(other) != self._hash:
            return False
        return _same(self, other)

    def __repr__(self) -> str:
        return _render(self)

    def _repr_parts(self) -> Iterator[str | _Sub]:
        """The pieces of `repr`: literal text and sub-values, in order (see `_render`)."""
        yield f"{self.kind}("
        first = True
        if self._star is not None:
            for value in getattr(self, self._star):
                if not first:
                    yield ", "
                first = False
                yield _Sub(value)
        for f in fields(self):
            if f.name == "_hash" or f.name == self._star:
                continue
            value = getattr(self, f.name)
            if f.name in self._positional:
                label = ""
            elif not _same(value, f.default):
                label = f"{f.name}="
            else:
                continue
            if not first:
                yield ", "
            first = False
            yield label
            yield _Sub(value)
        yield ")"

    def _children(self) -> Iterator[tuple[str, Any]]:
        """(selector, child) for each child slot, in code order; leaves have none."""
        return iter(())


@dataclass(frozen=True, slots=True, repr=False)
class Retry:
    """Retry policy of an effect: after failed attempt i (from 1) wait initial * multiplier**(i-1), capped at
    max_interval, then try again, up to max_attempts in all (None: no count limit). With `max_elapsed=` seconds,
    no attempt starts later than that after the first attempt started: the last failure is the effect's. An
    exception in `non_retryable` fails at once."""

    max_attempts: int | None = 3
    initial: float = 0.1
    multiplier: float = 2.0
    max_interval: float = 30.0
    non_retryable: tuple[type[BaseException], ...] = ()  # these fail the effect at once, without retrying
    max_elapsed: float | None = None  # seconds from the first attempt's start; None: no time limit

    def __repr__(self) -> str:
        # `max_elapsed` is shown only when set: the text is part of the fingerprint, so a policy written before
        # the field existed keeps the fingerprint its stored cases recorded.
        shown = [
            f"max_attempts={self.max_attempts!r}", f"initial={self.initial!r}", f"multiplier={self.multiplier!r}",
            f"max_interval={self.max_interval!r}", f"non_retryable={self.non_retryable!r}",
        ]
        if self.max_elapsed is not None:
            shown.append(f"max_elapsed={self.max_elapsed!r}")
        return f"Retry({', '.join(shown)})"

    def gives_up(self, attempt: int, elapsed: float, delay: float) -> bool:
        """Whether attempt `attempt` (from 1), failed `elapsed` seconds after the first attempt started, is the
        last: the count is reached, or the next attempt would start after `max_elapsed`."""
        if self.max_attempts is not None and attempt >= self.max_attempts:
            return True
        return self.max_elapsed is not None and elapsed + delay > self.max_elapsed

    def delay(self, attempt: int) -> float:
        """Backoff before retry number `attempt` (1 = the wait after the first failure), never above the cap.

        The growth is capped before it can overflow: a steep multiplier or a high attempt number gives
        `max_interval`, never an OverflowError.
        """
        if self.initial <= 0:
            return 0.0
        try:
            raw = self.initial * self.multiplier ** (attempt - 1)
        except OverflowError:
            raw = math.inf
        return float(min(raw, self.max_interval))


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Task(Term):
    kind = "task"
    _positional = ("fn",)
    fn: Callable[..., Any]
    name: str | None = None


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Effect(Term):
    kind = "effect"
    _positional = ("fn",)
    fn: Callable[..., Any]
    name: str | None = None
    timeout: float | None = None
    retry: Retry | None = None
    _added = ("heartbeat_timeout",)
    heartbeat_timeout: float | None = None  # seconds an attempt may go without `wfsub.heartbeat()`


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Seq(Term):
    kind = "seq"
    _star = "steps"
    steps: tuple[Any, ...] = ()

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield from _indexed(self.steps)


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Par(Term):
    kind = "par"
    _star = "branches"
    branches: tuple[Any, ...] = ()
    join: JoinPolicy = "all"
    cancel_remaining: bool = False
    blocking: bool = False

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield from _indexed(self.branches)


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Xor(Term):
    kind = "xor"
    _star = "cases"
    cases: tuple[Any, ...] = ()
    default: Any = None

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield from _cases_of(self.cases, self.default)


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class MultiChoice(Term):
    kind = "multi_choice"
    _star = "cases"
    cases: tuple[Any, ...] = ()
    default: Any = None

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield from _cases_of(self.cases, self.default)


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Loop(Term):
    kind = "loop"
    _positional = ("body",)
    body: Any
    while_: Any = None
    until: Any = None
    times: Any = None
    max_iterations: Any = None

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield "", self.body


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Wait(Term):
    kind = "wait"
    _positional = ("signal",)
    _added = ("reply", "check", "deadline")
    signal: Any
    into: Any = None
    transient: bool = False
    timeout: Any = None
    model: Any = None
    reply: Any = None  # fn(ctx) -> JSON value: the answer to an update this wait takes
    check: Any = None  # fn(ctx, payload) -> None | str: a string refuses the signal or update
    deadline: Any = None  # fn(ctx) -> epoch seconds or an ISO 8601 time with a timezone (instead of timeout=)


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Defer(Term):
    kind = "defer"
    _positional = ("branches",)
    _added = ("model", "check", "deadline")
    branches: Any  # tuple of (signal name, term) pairs when given a mapping
    timeout: Any = None
    on_timeout: Any = None
    model: Any = None  # tuple of (signal name, pydantic model) pairs
    check: Any = None  # tuple of (signal name, fn(ctx, payload) -> None | str) pairs
    deadline: Any = None  # fn(ctx) -> epoch seconds or an ISO 8601 time with a timezone (instead of timeout=)

    def _repr_parts(self) -> Iterator[str | _Sub]:
        yield "defer("
        if isinstance(self.branches, tuple):
            yield "{"
            for i, pair in enumerate(self.branches):
                yield ", " if i else ""
                if isinstance(pair, tuple) and len(pair) == 2:
                    yield f"{pair[0]!r}: "
                    yield _Sub(pair[1])
                else:
                    yield _Sub(pair)
            yield "}"
        else:
            yield _Sub(self.branches)
        if self.timeout is not None:
            yield f", timeout={self.timeout!r}"
        if self.deadline is not None:
            yield ", deadline="
            yield _Sub(self.deadline)
        if self.on_timeout is not None:
            yield ", on_timeout="
            yield _Sub(self.on_timeout)
        for label in ("model", "check"):
            value = getattr(self, label)
            if value is not None:
                yield f", {label}="
                yield from _pairs_parts(value)
        yield ")"

    def _children(self) -> Iterator[tuple[str, Any]]:
        if isinstance(self.branches, tuple):
            for pair in self.branches:
                if isinstance(pair, tuple) and len(pair) == 2:
                    yield str(pair[0]), pair[1]
        if self.on_timeout is not None:
            yield "timeout", self.on_timeout


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Reply(Term):
    kind = "reply"
    _positional = ("name", "fn")
    name: Any
    fn: Any  # fn(ctx) -> JSON value


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Sleep(Term):
    kind = "sleep"
    _positional = ("seconds",)
    _added = ("until",)
    seconds: Any = None  # a number, or fn(ctx) -> seconds
    until: Any = None  # fn(ctx) -> epoch seconds or an ISO 8601 time with a timezone

    def _repr_parts(self) -> Iterator[str | _Sub]:
        if self.until is not None and self.seconds is None:
            yield "sleep(until="
            yield _Sub(self.until)
            yield ")"
        else:
            yield from Term._repr_parts(self)


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Scope(Term):
    kind = "scope"
    _positional = ("name", "body")
    name: Any
    body: Any
    on_cancel: Any = None
    on_error: Any = None
    error_into: Any = "error"
    _added = ("finally_",)
    finally_: Any = None

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield "", self.body
        if self.on_cancel is not None:
            yield "on_cancel", self.on_cancel
        if self.on_error is not None:
            yield "on_error", self.on_error
        if self.finally_ is not None:
            yield "finally", self.finally_


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Saga(Term):
    kind = "saga"
    _star = "steps"
    steps: tuple[Any, ...] = ()

    def _children(self) -> Iterator[tuple[str, Any]]:
        for i, step in enumerate(self.steps if isinstance(self.steps, tuple) else ()):
            if isinstance(step, tuple) and len(step) == 2:
                yield str(i), step[0]
                yield f"{i}.compensation", step[1]
            else:
                yield str(i), step


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class MI(Term):
    kind = "mi"
    _positional = ("body",)
    body: Any
    count: Any = None
    items: Any = None
    join: JoinPolicy = "all"
    cancel_remaining: bool = True
    min: Any = None
    max: Any = None
    dynamic: bool | Literal["open"] = False
    until: Any = None
    collect: Any = None
    name: Any = None

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield "", self.body


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Interleave(Term):
    kind = "interleave"
    _star = "branches"
    branches: tuple[Any, ...] = ()
    order: Any = ()

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield from _indexed(self.branches)


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Critical(Term):
    kind = "critical"
    _positional = ("name", "body")
    name: Any
    body: Any

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield "", self.body


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Milestone(Term):
    kind = "milestone"
    _positional = ("name", "body")
    name: Any
    body: Any

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield "", self.body


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class WhenMilestone(Term):
    kind = "when_milestone"
    _positional = ("name", "branch")
    name: Any
    branch: Any

    def _children(self) -> Iterator[tuple[str, Any]]:
        yield "", self.branch


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Call(Term):
    kind = "call"
    _positional = ("name",)
    name: Any


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Terminate(Term):
    kind = "terminate"


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class CancelRegion(Term):
    kind = "cancel_region"
    _positional = ("name",)
    name: Any


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class CompleteRegion(Term):
    kind = "complete_region"
    _positional = ("name",)
    name: Any


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class AddInstances(Term):
    kind = "add_instances"
    _positional = ("name",)
    name: Any
    items: Any = None


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class CloseInstances(Term):
    kind = "close_instances"
    _positional = ("name",)
    name: Any


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class StartCase(Term):
    """Start another case (a child) of a registered workflow; see `start_case`."""

    kind = "start_case"
    _positional = ("workflow",)
    workflow: Any
    data: Any = None
    case_id: Any = None
    wait: Any = True
    into: Any = None
    on_parent_cancel: Any = "cancel"
    _added = ("queue", "priority", "dedup")
    queue: Any = None  # the child is started through this queue of the Substrate's `queues=`
    priority: Any = None  # its priority there (None: 0)
    dedup: Any = None  # its dedup key there


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class SignalCase(Term):
    """Send a signal to another case; see `signal_case`."""

    kind = "signal_case"
    _positional = ("name",)
    name: Any
    case_id: Any = None
    payload: Any = None


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Net(Term):
    """An unstructured graph of nodes (see `net`); mappings are kept as tuples of pairs (hashable, ordered)."""

    kind = "net"
    _positional = ("nodes", "edges")
    nodes: Any  # tuple of (name, term) pairs when given a mapping
    edges: Any  # tuple of (src, dst) / (src, dst, pred) tuples when given a sequence
    split: Any = ()  # tuple of (node, kind) pairs when given a mapping
    join: Any = ()

    def _repr_parts(self) -> Iterator[str | _Sub]:
        yield "net("
        yield from _pairs_parts(self.nodes)
        yield ", "
        if isinstance(self.edges, tuple):
            yield "["
            for i, edge in enumerate(self.edges):
                yield ", " if i else ""
                yield _Sub(edge)
            yield "]"
        else:
            yield _Sub(self.edges)
        for label, value in (("split", self.split), ("join", self.join)):
            if value != ():
                yield f", {label}="
                yield from _pairs_parts(value)
        yield ")"

    def _children(self) -> Iterator[tuple[str, Any]]:
        if isinstance(self.nodes, tuple):
            for pair in self.nodes:
                if isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str):
                    yield pair[0], pair[1]


def _pairs_parts(value: object) -> Iterator[str | _Sub]:
    """A tuple of (key, value) pairs rendered as the dict it was built from."""
    if not (isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value)):
        yield _Sub(value)
        return
    yield "{"
    for i, (key, item) in enumerate(value):
        yield ", " if i else ""
        yield f"{key!r}: "
        yield _Sub(item)
    yield "}"


# -- tree helpers: shared by validation, the compiler and every tool that walks a term ------------------


def term_classes() -> tuple[type[Term], ...]:
    """Every concrete term class, in definition order: the registry each per-kind table is built from."""
    return tuple(_all_subclasses(Term))


def by_kind(namespace: Mapping[str, Any], prefix: str, what: str) -> dict[type[Term], Any]:
    """`{term class: namespace[prefix + kind]}` for every term class; a missing entry is an ImportError.

    Each layer keeps one function per construct (`_check_<kind>`, `_emit_<kind>`) and builds its dispatch
    table with this at import, so a construct that a layer forgot fails loudly before anything runs.
    """
    table: dict[type[Term], Any] = {}
    for cls in term_classes():
        entry = namespace.get(prefix + cls.kind)
        if entry is None:
            raise ImportError(f"{what} has no {prefix}{cls.kind} for term kind {cls.kind!r}")
        table[cls] = entry
    return table


def _all_subclasses(cls: type[Term]) -> list[type[Term]]:
    out: list[type[Term]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def child_path(path: str, selector: str, child: object) -> str:
    """Path of a child node: `path[selector].kind`, or `path.kind` for a container's single body."""
    kind = child.kind if isinstance(child, Term) else "?"
    return f"{path}[{selector}].{kind}" if selector else f"{path}.{kind}"


def children(term: Term) -> Iterator[tuple[str, Any]]:
    """(selector, child) for every child slot of a term, in code order (the selector names the slot in paths)."""
    return term._children()


def _indexed(items: object) -> Iterator[tuple[str, Any]]:
    for i, child in enumerate(items if isinstance(items, tuple) else ()):
        yield str(i), child


def _cases_of(cases: tuple[Any, ...], default: object) -> Iterator[tuple[str, Any]]:
    for i, case in enumerate(cases):
        if isinstance(case, tuple) and len(case) == 2:
            yield str(i), case[1]
    if default is not None:
        yield "default", default


def branch_name(term: object) -> str | None:
    """The name an `interleave` order uses for a branch: a task's or effect's name, a scope's name."""
    if isinstance(term, Task | Effect):
        return term.name or getattr(term.fn, "__name__", None)
    if isinstance(term, Scope) and isinstance(term.name, str):
        return term.name
    return None


# -- constructors: the public spelling of the algebra -------------------------------------------------


def task(fn: Callable[[Mapping[str, Any]], Mapping[str, Any] | None], *, name: str | None = None) -> Term:
    """A pure synchronous step run inline by the vm: `fn(ctx) -> Mapping | None`, merged into the data."""
    return Task(fn, name)


def effect(
    fn: Callable[[Mapping[str, Any]], Any],
    *,
    name: str | None = None,
    timeout: float | None = None,
    retry: Retry | None = None,
    heartbeat_timeout: float | None = None,
) -> Term:
    """An asynchronous step run by the runtime: `async fn(ctx) -> Mapping | None`.

    With `heartbeat_timeout=` seconds, an attempt that goes that long without calling `wfsub.heartbeat()` is
    cancelled and fails with `HeartbeatTimeout` (the retry policy applies).
    """
    return Effect(fn, name, timeout, retry, heartbeat_timeout)


def seq(*steps: Term) -> Term:
    """Run the steps one after another (WCP1).

    A seq given as a step is spliced in (`seq(seq(a, b), c)` is `seq(a, b, c)`): the same workflow, so a builder
    loop like `wf = seq(wf, step)` stays one level deep however long it grows.
    """
    flat: list[Any] = []
    for step in steps:
        if type(step) is Seq and step.steps:
            flat.extend(step.steps)
        else:
            flat.append(step)
    return Seq(tuple(flat))


def par(*branches: Term, join: JoinPolicy = "all", cancel_remaining: bool = False, blocking: bool = False) -> Term:
    """Parallel split and join: `join` is "all", "first", an int n, or "each" (WCP2, 3, 8, 9, 29, 30, 32).

    `blocking=True` (with "first" or n): once the join fired, a thread that comes back to the par (a loop) waits
    until every branch of the current activation has arrived or been withdrawn (WCP28, 31).
    """
    return Par(tuple(branches), join, cancel_remaining, blocking)


def _cases(cases: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(tuple(c) if isinstance(c, list) else c for c in cases)


def xor(*cases: tuple[Callable[[Mapping[str, Any]], bool], Term], default: Term | None = None) -> Term:
    """Exclusive choice: the first `(pred, branch)` whose predicate holds, else `default` (WCP4, 5)."""
    return Xor(_cases(cases), default)


def multi_choice(
    *cases: tuple[Callable[[Mapping[str, Any]], bool], Term], default: Term | None = None
) -> Term:
    """OR-split: every branch whose predicate holds runs; a synchronizing merge waits for them (WCP6, 7, 37)."""
    return MultiChoice(_cases(cases), default)


def loop(
    body: Term,
    *,
    while_: Callable[[Mapping[str, Any]], bool] | None = None,
    until: Callable[[Mapping[str, Any]], bool] | None = None,
    times: int | None = None,
    max_iterations: int | None = None,
) -> Term:
    """Structured loop with exactly one of `while_` (pre-test), `until` (post-test), `times` (WCP21)."""
    return Loop(body, while_, until, times, max_iterations)


def wait(
    signal: str,
    *,
    into: str | None = None,
    transient: bool = False,
    timeout: float | Callable[[Mapping[str, Any]], float] | None = None,
    model: type | None = None,
    reply: Callable[[Mapping[str, Any]], Any] | None = None,
    check: Callable[[Mapping[str, Any], Any], str | None] | None = None,
    deadline: Callable[[Mapping[str, Any]], float | str] | None = None,
) -> Term:
    """Park until `signal` arrives; its payload is stored at `into` (default: the signal name) (WCP23, 24).

    `timeout=` seconds (or a function of the case data returning them, called only when the wait has to park and
    arm its timer): when nothing arrived in time, `WaitTimeout` is a failure at this node. `deadline=fn` instead
    names the time itself (as `sleep(until=)`: epoch seconds or an ISO 8601 time with a timezone, computed from
    the case data when the wait parks): nothing by then is a `WaitTimeout`. `model=` (a pydantic
    model class): a payload is validated when it is sent (an invalid one is refused with SignalRejected carrying
    pydantic's errors, and nothing changes) and stored as the model's JSON-mode dump.

    `reply=fn(ctx)`: when this wait takes an update (`sub.update(...)`), fn runs on the data with the payload
    merged and its JSON value is the update's answer. `check=fn(ctx, payload)`: runs against the case data as the
    wait takes a signal or update; a string refuses it (`SignalRejected` carrying the string) and nothing is
    stored: the wait goes on waiting.
    """
    return Wait(signal, into, transient, timeout, model, reply, check, deadline)


def defer(
    branches: Mapping[str, Term],
    *,
    timeout: float | Callable[[Mapping[str, Any]], float] | None = None,
    on_timeout: Term | None = None,
    model: Mapping[str, type] | None = None,
    check: Mapping[str, Callable[[Mapping[str, Any], Any], str | None]] | None = None,
    deadline: Callable[[Mapping[str, Any]], float | str] | None = None,
) -> Term:
    """Deferred choice: the first signal named (or the timeout) picks its branch; the rest are withdrawn.

    `timeout=` seconds, or a function of the case data returning them (called only when the choice has to park
    and arm its timer); or `deadline=fn`, the time itself, as `sleep(until=)` takes it (one of the two, with
    `on_timeout=`). `model={signal: Model}` and `check={signal: fn(ctx, payload)}` as on `wait`, per signal.
    """
    shaped: Any = tuple(branches.items()) if isinstance(branches, Mapping) else branches
    models: Any = tuple(model.items()) if isinstance(model, Mapping) else model
    checks: Any = tuple(check.items()) if isinstance(check, Mapping) else check
    return Defer(shaped, timeout, on_timeout, models or None, checks or None, deadline)


def reply(name: str, fn: Callable[[Mapping[str, Any]], Any]) -> Term:
    """Answer the update `name` that this thread took at an earlier `wait(name)`: fn(ctx)'s JSON value goes back
    to the `update` caller. A thread that took no such update (or answered it already) passes by."""
    return Reply(name, fn)


def sleep(
    seconds: float | Callable[[Mapping[str, Any]], float] | None = None,
    *,
    until: Callable[[Mapping[str, Any]], float | str] | None = None,
) -> Term:
    """A durable timer: park for `seconds` of the runtime's clock, or until the time `until(ctx)` returns.

    `seconds` is a number, or a function of the case data returning one; `until=fn` returns epoch seconds or an
    ISO 8601 time with a timezone (`"2027-01-01T09:00:00+01:00"`). The vm calls the function when the step starts,
    so replay computes the same timer; a value that is not a finite number or a valid time fails the step.
    """
    return Sleep(seconds, until)


def scope(
    name: str,
    body: Term,
    *,
    on_cancel: Term | None = None,
    on_error: Term | None = None,
    error_into: str = "error",
    finally_: Term | None = None,
) -> Term:
    """A named region (WCP19, 25, 26): cancelling it withdraws all of its work; with `on_cancel` the thread then
    goes through `on_cancel` and on after the scope.

    With `on_error`, a failure inside `body` withdraws the body (compensating its sagas), stores the error
    record `{type, message, path, compensated, cause}` at `data[error_into]`, runs `on_error` and goes on after
    the scope: try/except for workflows.

    `finally_` runs after the body ends, after `on_error` or `on_cancel` when one ran, and when the body is
    withdrawn (a failure on its way out, a region or case cancel, a join's cancel_remaining), before the failure
    goes on or the cancel completes: Python's `finally`. Not after `terminate()` or `cancel(compensate=False)`,
    which end a case at once. The docs' semantics page ("`scope(finally_=)`") says what a failing `finally_` does.
    """
    return Scope(name, body, on_cancel, on_error, error_into, finally_)


def saga(*steps: Term | tuple[Term, Term]) -> Term:
    """Steps run in sequence, each an action or an `(action, compensation)` pair. When the saga's work is
    withdrawn before it ended (a failure, a cancel, a join), the compensations of its completed steps run in
    reverse order."""
    return Saga(tuple(tuple(s) if isinstance(s, list) else s for s in steps))


def mi(
    body: Term,
    *,
    count: int | Callable[[Mapping[str, Any]], int] | None = None,
    items: Callable[[Mapping[str, Any]], Any] | None = None,
    join: JoinPolicy = "all",
    cancel_remaining: bool = True,
    min: int | None = None,  # noqa: A002 - the documented parameter name
    max: int | None = None,  # noqa: A002
    dynamic: bool | Literal["open"] = False,
    until: Callable[[Any], bool] | None = None,
    collect: str | None = None,
    name: str | None = None,
) -> Term:
    """Multiple instances of `body` (WCP12-15, 26, 27, 34-36, 41, 42).

    `dynamic=True`: `add_instances(name, ...)` adds instances until the join fires. `dynamic="open"`: the mi
    starts with the instances of `count=` or `items=` (`count=0`: none) and takes more until
    `close_instances(name)` (strict WCP15).
    """
    return MI(body, count, items, join, cancel_remaining, min, max, dynamic, until, collect, name)


def interleave(*branches: Term, order: Any = ()) -> Term:
    """Each branch exactly once, never two at a time; `order` holds (before, after) pairs (WCP17, 40)."""
    shaped = tuple(tuple(p) if isinstance(p, list) else p for p in order) if isinstance(
        order, list | tuple
    ) else order
    return Interleave(tuple(branches), shaped)


def critical(name: str, body: Term) -> Term:
    """Mutual exclusion among the `critical` sections of a case that share `name` (WCP39)."""
    return Critical(name, body)


def milestone(name: str, body: Term) -> Term:
    """While a token is inside `body`, the milestone `name` is reached (WCP18)."""
    return Milestone(name, body)


def when_milestone(name: str, branch: Term) -> Term:
    """Start `branch` only while milestone `name` is reached; withdrawn once it has passed (WCP18)."""
    return WhenMilestone(name, branch)


def call(name: str) -> Term:
    """Run the workflow registered under `name` in the library (WCP22; recursion allowed, depth limited)."""
    return Call(name)


def terminate() -> Term:
    """Cancel all remaining work of the case and end it as done (WCP43)."""
    return Terminate()


def _as_pairs(value: object) -> Any:
    if value is None:
        return ()
    return tuple(value.items()) if isinstance(value, Mapping) else value


def net(
    nodes: Mapping[str, Term],
    edges: Sequence[tuple[str, str] | tuple[str, str, Callable[[Mapping[str, Any]], bool]]],
    *,
    split: Mapping[str, str] | None = None,
    join: Mapping[str, str] | None = None,
) -> Term:
    """An unstructured graph (WCP10, 11, 33, 38): `nodes={name: term}`, `edges=[(src, dst) or (src, dst, pred)]`
    between the nodes and the reserved `"start"` and `"end"`; cycles are allowed.

    `split={node: "and" | "xor" | "or"}` (default "and"; xor takes the first edge whose predicate holds, or
    every such edge; an edge without a predicate always holds). `join={node: "xor" | "and" | "or"}` (default
    "xor": every arrival starts the node); an "and" join fires once every incoming edge holds a token (surplus
    tokens wait for later firings); an "or" join fires once no token of the net can still reach one of its
    empty incoming edges. The net ends when nothing in it can move: done if a token reached "end".
    """
    shaped_edges: Any = edges
    if isinstance(edges, list | tuple):
        shaped_edges = tuple(tuple(e) if isinstance(e, list | tuple) else e for e in edges)
    return Net(_as_pairs(nodes), shaped_edges, _as_pairs(split), _as_pairs(join))


def start_case(
    workflow: str,
    *,
    data: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None = None,
    case_id: Callable[[Mapping[str, Any]], str] | None = None,
    wait: bool = True,
    into: str | None = None,
    on_parent_cancel: str = "cancel",
    queue: str | None = None,
    priority: int | None = None,
    dedup: str | None = None,
) -> Term:
    """Start a child case of the registered workflow `workflow`, with the start data `data(ctx)` (None: none).

    Its id is `case_id(ctx)`, by default `{parent id}/{node path}` (plus `/{index}` for each enclosing mi
    instance); the id is the step's idempotency key, so the child starts once however often the step is tried.
    `wait=True`: the step waits for the child's end and merges its final data `into` a key (None: into the data
    itself); a failed child fails the step with CaseFailed (a cancelled one with CaseCancelled). `wait=False`:
    the child's id is stored `into` (default "child") and the parent goes on. `on_parent_cancel="cancel"`: a
    parent cancelled (or the step withdrawn) while it waits cancels the child, with compensation; `"abandon"`
    leaves it running. `queue=` (a queue of the Substrate's `queues=`), `priority=`, `dedup=`: the child goes
    through that queue as `new_case(..., queue=, priority=, dedup=)` would start it (a queued child waits there;
    a dedup key held by a live case of the queue fails the step with CaseExists).
    """
    return StartCase(workflow, data, case_id, wait, into, on_parent_cancel, queue, priority, dedup)


def signal_case(
    name: str,
    *,
    case_id: Callable[[Mapping[str, Any]], str],
    payload: Callable[[Mapping[str, Any]], Any] | None = None,
) -> Term:
    """Send signal `name` with `payload(ctx)` (None: no payload) to the case `case_id(ctx)`: applied once (its
    request id is derived from this case's id and the step's node path and instance), journaled like an effect's
    outcome. A refusal (no such case, an ended case, a signal that case cannot take) fails the step with its
    reason."""
    return SignalCase(name, case_id, payload)


def cancel_region(name: str) -> Term:
    """A step that cancels region `name` of its own case (WCP19, 25, 26): its work is withdrawn.

    A region written in the same mi body or workflow as the step is addressed only in the step's own mi
    instance and call; otherwise every live activation is. A region that is not active is left alone (traced).
    """
    return CancelRegion(name)


def complete_region(name: str) -> Term:
    """A step that completes region `name` of its own case (WCP27): an mi joins now, a scope goes on after itself."""
    return CompleteRegion(name)


def add_instances(name: str, *, items: Callable[[Mapping[str, Any]], Any]) -> Term:
    """A step that adds one instance per item of `items(ctx)` to the dynamic mi `name` of its own case (WCP15)."""
    return AddInstances(name, items)


def close_instances(name: str) -> Term:
    """A step that closes the dynamic mi `name` of its own case: it takes no more instances."""
    return CloseInstances(name)

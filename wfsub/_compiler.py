"""Term -> Program: flat bytecode with resolved jumps, a constant table and a stable fingerprint.

Layout of each construct (`s` is a constant-table slot holding the construct's spec):

    task          TASK fn-slot
    effect        EFFECT s
    par / mc      PAR_SPLIT s | MC_SPLIT s ; branch0 ; ARRIVE ; branch1 ; ARRIVE ... ; after:
    xor           XOR s ; case0 ; JUMP end ; case1 ; JUMP end ... ; [default] ; end:
    loop          LOOP_ENTER s ; [LOOP_TEST s] (while_ only) ; body ; LOOP_BACK s ; exit:
    wait / sleep  WAIT s / SLEEP s
    defer         DEFER s ; branch0 ; JUMP end ... ; [on_timeout] ; end:
    scope         SCOPE_ENTER s ; body ; LEAVE after ; [on_cancel] ; after:
    mi            MI_START s ; body ; ARRIVE ; after:
    interleave    ILV_START s ; branch0 ; ARRIVE ; branch1 ; ARRIVE ... ; after:
    critical      CRIT_ENTER s ; body ; LEAVE next
    milestone     MS_ENTER s ; body ; LEAVE next
    when_ms       WHEN_MS s ; branch
    call          CALL s                      (subroutine: body ; RET)
    terminate     TERMINATE
The root ends with END. Library workflows reachable through `call` are compiled once each, after the root.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from ._errors import InvalidWorkflow
from ._terms import (
    MI,
    Call,
    Critical,
    Defer,
    Effect,
    Interleave,
    Loop,
    Milestone,
    MultiChoice,
    Par,
    Retry,
    Scope,
    Seq,
    Sleep,
    Task,
    Term,
    Terminate,
    Wait,
    WhenMilestone,
    Xor,
)
from ._validate import _branch_name, child_path, validate

DEFAULT_MAX_CALL_DEPTH = 100


class Op(IntEnum):
    """Opcodes. Only the compiler and the disassembler use the enum; the vm sees plain ints."""

    TASK = 0
    JUMP = 1
    EFFECT = 2
    END = 3
    PAR_SPLIT = 4
    ARRIVE = 5
    XOR = 6
    MC_SPLIT = 7
    LOOP_ENTER = 8
    LOOP_TEST = 9
    LOOP_BACK = 10
    WAIT = 11
    DEFER = 12
    SLEEP = 13
    SCOPE_ENTER = 14
    LEAVE = 15
    MI_START = 16
    ILV_START = 17
    CRIT_ENTER = 18
    MS_ENTER = 19
    WHEN_MS = 20
    CALL = 21
    RET = 22
    TERMINATE = 23


# -- specs: the constants an instruction's operand points at ------------------------------------------

ALL = -1  # join "all": needs every branch that was not withdrawn


@dataclass(frozen=True, slots=True)
class EffectSpec:
    fn: Callable[..., Any]
    name: str
    timeout: float | None
    retry: Retry | None


@dataclass(frozen=True, slots=True)
class SplitSpec:
    """par / multi_choice: where the branches start and how the join fires."""

    starts: tuple[int, ...]
    need: int  # ALL, or how many arrivals fire the join
    each: bool  # multi-merge: every arrival continues
    cancel_remaining: bool
    after: int
    preds: tuple[Callable[..., Any], ...] = ()  # multi_choice only
    default: int = -1  # multi_choice only: start of the default branch
    policy: str = "all"


@dataclass(frozen=True, slots=True)
class XorSpec:
    preds: tuple[Callable[..., Any], ...]
    targets: tuple[int, ...]
    default: int  # -1: none


@dataclass(frozen=True, slots=True)
class LoopSpec:
    mode: str  # "while" | "until" | "times"
    pred: Callable[..., Any] | None
    times: int
    max_iterations: int | None
    body: int
    test: int  # LOOP_TEST ip (while_) or -1
    exit: int


@dataclass(frozen=True, slots=True)
class WaitSpec:
    signal: str
    into: str
    transient: bool  # only a signal that arrives while waiting wakes it; it never takes a buffered one


@dataclass(frozen=True, slots=True)
class DeferSpec:
    signals: tuple[str, ...]
    targets: tuple[int, ...]
    timeout: float | None
    timeout_target: int


@dataclass(frozen=True, slots=True)
class ScopeSpec:
    name: str
    on_cancel: int  # -1: none
    after: int


@dataclass(frozen=True, slots=True)
class MISpec:
    count: int | None
    count_fn: Callable[..., Any] | None
    items_fn: Callable[..., Any] | None
    need: int  # ALL, n, or 0 for join=None
    cancel_remaining: bool
    min: int | None
    max: int | None
    dynamic: bool
    until: Callable[..., Any] | None
    collect: str | None
    name: str | None
    body: int
    after: int
    policy: str


@dataclass(frozen=True, slots=True)
class InterleaveSpec:
    starts: tuple[int, ...]
    before: tuple[frozenset[int], ...]  # branch i may start once every branch in before[i] is done
    after: int


@dataclass(frozen=True, slots=True)
class NameSpec:
    """critical / milestone / when_milestone: the shared name."""

    name: str


@dataclass(frozen=True, slots=True)
class CallSpec:
    name: str
    entry: int


@dataclass(frozen=True, slots=True)
class SleepSpec:
    seconds: float


@dataclass(frozen=True, slots=True, eq=False)
class Program:
    """A compiled workflow: immutable, shared by every case of the term."""

    ops: tuple[int, ...]
    args: tuple[int, ...]
    consts: tuple[Any, ...]
    paths: tuple[str, ...]
    labels: tuple[str, ...]  # per instruction: task/effect name or "" (for traces)
    fingerprint: str
    signals: frozenset[str]  # every signal name some wait/defer listens for
    persistent_signals: frozenset[str]  # names with at least one non-transient wait (buffered)
    regions: Mapping[str, str]  # region name -> "scope" | "mi"
    entries: Mapping[str, int]  # library name -> entry ip
    max_call_depth: int
    term: Term
    code: tuple[tuple[int, Any], ...]  # (opcode, operand) with operands resolved: what the vm runs

    def __len__(self) -> int:
        return len(self.ops)

    def dis(self) -> str:
        """Readable bytecode, one instruction per line: ip, opcode, operand, what it points at, node path."""
        lines = [f"; program {self.fingerprint[:16]} ({len(self.ops)} instructions)"]
        starts = {ip: name for name, ip in self.entries.items()}
        for ip, (op, arg) in enumerate(zip(self.ops, self.args, strict=True)):
            if ip in starts:
                lines.append(f"; call target {starts[ip]!r}")
            name = Op(op).name
            detail = ""
            if op in (Op.JUMP, Op.LEAVE):
                detail = f"-> {arg}"
            elif op == Op.TASK:
                detail = f"s{arg} {self.labels[ip]}"
            elif arg >= 0 and op not in (Op.END, Op.ARRIVE, Op.RET, Op.TERMINATE):
                detail = f"s{arg} {_describe(self.consts[arg])}"
            lines.append(f"{ip:5d}  {name:<12} {detail:<56} {self.paths[ip]}")
        return "\n".join(lines)


def _describe(spec: Any) -> str:
    if isinstance(spec, EffectSpec):
        return spec.name
    fields = getattr(spec, "__dataclass_fields__", {})
    parts = []
    for f in fields:
        v = getattr(spec, f)
        if callable(v):
            v = getattr(v, "__qualname__", "fn")
        elif isinstance(v, tuple) and v and callable(v[0]):
            v = "(" + ", ".join(getattr(p, "__qualname__", "fn") for p in v) + ")"
        parts.append(f"{f}={v}")
    return " ".join(parts)


def _fn_id(fn: object) -> str:
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qualname}"


def canonical(term: object) -> str:
    """Structure of a term with functions named by module and qualified name: input of the fingerprint."""
    out: list[str] = []

    def emit(value: object) -> None:
        if isinstance(value, Term):
            out.append(value.kind + "(")
            for f in value.__dataclass_fields__:
                if f != "_hash":
                    emit(getattr(value, f))
                    out.append(",")
            out.append(")")
        elif isinstance(value, tuple):
            out.append("(")
            for v in value:
                emit(v)
                out.append(",")
            out.append(")")
        elif isinstance(value, Retry):
            out.append(repr(value))
        elif callable(value):
            out.append(_fn_id(value))
        else:
            out.append(repr(value))

    emit(term)
    return "".join(out)


def _label(term: Task | Effect) -> str:
    return term.name or getattr(term.fn, "__name__", None) or repr(term.fn)


class _Emitter:
    def __init__(self, library: Mapping[str, Term]) -> None:
        self.ops: list[int] = []
        self.args: list[int] = []
        self.paths: list[str] = []
        self.labels: list[str] = []
        self.consts: list[Any] = []
        self.library = library
        self.entries: dict[str, int] = {}
        self.pending_calls: list[tuple[int, str]] = []  # (CALL ip, name): patched once entries are known
        self.signals: set[str] = set()
        self.persistent: set[str] = set()
        self.regions: dict[str, str] = {}

    def emit(self, op: Op, arg: int, path: str, label: str = "") -> int:
        self.ops.append(int(op))
        self.args.append(arg)
        self.paths.append(path)
        self.labels.append(label)
        return len(self.ops) - 1

    def const(self, value: Any) -> int:
        self.consts.append(value)
        return len(self.consts) - 1

    def here(self) -> int:
        return len(self.ops)

    def set_const(self, slot: int, value: Any) -> None:
        self.consts[slot] = value

    def term(self, t: Term, path: str) -> None:
        _EMIT[type(t)](self, t, path)

    def child(self, t: Term, path: str, selector: str) -> None:
        self.term(t, child_path(path, selector, t))


def _task(e: _Emitter, t: Task, path: str) -> None:
    e.emit(Op.TASK, e.const(t.fn), path, _label(t))


def _effect(e: _Emitter, t: Effect, path: str) -> None:
    spec = EffectSpec(t.fn, _label(t), t.timeout, t.retry)
    e.emit(Op.EFFECT, e.const(spec), path, _label(t))


def _seq(e: _Emitter, t: Seq, path: str) -> None:
    for i, step in enumerate(t.steps):
        e.child(step, path, str(i))


def _need(join: Any, branches: int) -> tuple[int, str]:
    if join == "all":
        return ALL, "all"
    if join == "first":
        return 1, "first"
    if join == "each":
        return 1, "each"
    if join is None:
        return 0, "none"
    return int(join), f"{join}-of-{branches}"


def _par(e: _Emitter, t: Par, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.PAR_SPLIT, slot, path)
    starts = []
    for i, branch in enumerate(t.branches):
        starts.append(e.here())
        e.child(branch, path, str(i))
        e.emit(Op.ARRIVE, -1, path)
    need, policy = _need(t.join, len(t.branches))
    e.set_const(slot, SplitSpec(tuple(starts), need, t.join == "each", t.cancel_remaining, e.here(), policy=policy))


def _xor(e: _Emitter, t: Xor, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.XOR, slot, path)
    targets, jumps = [], []
    for i, (_, branch) in enumerate(t.cases):
        targets.append(e.here())
        e.child(branch, path, str(i))
        jumps.append(e.emit(Op.JUMP, -1, path))
    default = -1
    if t.default is not None:
        default = e.here()
        e.child(t.default, path, "default")
    end = e.here()
    for j in jumps:
        e.args[j] = end
    e.set_const(slot, XorSpec(tuple(p for p, _ in t.cases), tuple(targets), default))


def _multi_choice(e: _Emitter, t: MultiChoice, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.MC_SPLIT, slot, path)
    starts = []
    for i, (_, branch) in enumerate(t.cases):
        starts.append(e.here())
        e.child(branch, path, str(i))
        e.emit(Op.ARRIVE, -1, path)
    default = -1
    if t.default is not None:
        default = e.here()
        e.child(t.default, path, "default")
        e.emit(Op.ARRIVE, -1, path)
    spec = SplitSpec(tuple(starts), ALL, False, False, e.here(), tuple(p for p, _ in t.cases), default)
    e.set_const(slot, spec)


def _loop(e: _Emitter, t: Loop, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.LOOP_ENTER, slot, path)
    mode = "while" if t.while_ is not None else "until" if t.until is not None else "times"
    test = e.emit(Op.LOOP_TEST, slot, path) if mode == "while" else -1
    body = e.here()
    e.child(t.body, path, "")
    e.emit(Op.LOOP_BACK, slot, path)
    pred = t.while_ if mode == "while" else t.until
    spec = LoopSpec(mode, pred, t.times or 0, t.max_iterations, body, test, e.here())
    e.set_const(slot, spec)


def _wait(e: _Emitter, t: Wait, path: str) -> None:
    e.signals.add(t.signal)
    if not t.transient:
        e.persistent.add(t.signal)
    e.emit(Op.WAIT, e.const(WaitSpec(t.signal, t.into or t.signal, t.transient)), path)


def _defer(e: _Emitter, t: Defer, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.DEFER, slot, path)
    names, targets, jumps = [], [], []
    for name, branch in t.branches:
        e.signals.add(name)
        e.persistent.add(name)
        names.append(name)
        targets.append(e.here())
        e.child(branch, path, name)
        jumps.append(e.emit(Op.JUMP, -1, path))
    timeout_target = -1
    if t.on_timeout is not None:
        timeout_target = e.here()
        e.child(t.on_timeout, path, "timeout")
    end = e.here()
    for j in jumps:
        e.args[j] = end
    e.set_const(slot, DeferSpec(tuple(names), tuple(targets), t.timeout, timeout_target))


def _sleep(e: _Emitter, t: Sleep, path: str) -> None:
    e.emit(Op.SLEEP, e.const(SleepSpec(float(t.seconds))), path)


def _scope(e: _Emitter, t: Scope, path: str) -> None:
    e.regions[t.name] = "scope"
    slot = e.const(None)
    e.emit(Op.SCOPE_ENTER, slot, path)
    e.child(t.body, path, "")
    leave = e.emit(Op.LEAVE, -1, path)
    on_cancel = -1
    if t.on_cancel is not None:
        on_cancel = e.here()
        e.child(t.on_cancel, path, "on_cancel")
    e.args[leave] = e.here()
    e.set_const(slot, ScopeSpec(t.name, on_cancel, e.here()))


def _mi(e: _Emitter, t: MI, path: str) -> None:
    if t.name is not None:
        e.regions[t.name] = "mi"
    slot = e.const(None)
    e.emit(Op.MI_START, slot, path)
    body = e.here()
    e.child(t.body, path, "")
    e.emit(Op.ARRIVE, -1, path)
    need, policy = _need(t.join, -1)
    fixed = t.count if isinstance(t.count, int) else None
    if policy.endswith("-of--1"):
        policy = f"{t.join}-of-m"
    spec = MISpec(
        fixed,
        t.count if callable(t.count) else None,
        t.items,
        need,
        t.cancel_remaining,
        t.min,
        t.max,
        t.dynamic,
        t.until,
        t.collect,
        t.name,
        body,
        e.here(),
        policy,
    )
    e.set_const(slot, spec)


def _interleave(e: _Emitter, t: Interleave, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.ILV_START, slot, path)
    starts = []
    for i, branch in enumerate(t.branches):
        starts.append(e.here())
        e.child(branch, path, str(i))
        e.emit(Op.ARRIVE, -1, path)
    names: dict[str, int] = {}
    for i, b in enumerate(t.branches):
        n = _branch_name(b)
        if n is not None:
            names.setdefault(n, i)
    before: list[set[int]] = [set() for _ in t.branches]
    for a, b in t.order:
        before[b if isinstance(b, int) else names[b]].add(a if isinstance(a, int) else names[a])
    e.set_const(slot, InterleaveSpec(tuple(starts), tuple(frozenset(s) for s in before), e.here()))


def _critical(e: _Emitter, t: Critical | Milestone, path: str) -> None:
    op = Op.CRIT_ENTER if isinstance(t, Critical) else Op.MS_ENTER
    e.emit(op, e.const(NameSpec(t.name)), path)
    e.child(t.body, path, "")
    e.emit(Op.LEAVE, e.here() + 1, path)


def _when(e: _Emitter, t: WhenMilestone, path: str) -> None:
    e.emit(Op.WHEN_MS, e.const(NameSpec(t.name)), path)
    e.child(t.branch, path, "")


def _call(e: _Emitter, t: Call, path: str) -> None:
    ip = e.emit(Op.CALL, -1, path)
    e.pending_calls.append((ip, t.name))


def _terminate(e: _Emitter, t: Terminate, path: str) -> None:
    e.emit(Op.TERMINATE, -1, path)


_EMIT: dict[type, Callable[[_Emitter, Any, str], None]] = {
    Task: _task,
    Effect: _effect,
    Seq: _seq,
    Par: _par,
    Xor: _xor,
    MultiChoice: _multi_choice,
    Loop: _loop,
    Wait: _wait,
    Defer: _defer,
    Sleep: _sleep,
    Scope: _scope,
    MI: _mi,
    Interleave: _interleave,
    Critical: _critical,
    Milestone: _critical,
    WhenMilestone: _when,
    Call: _call,
    Terminate: _terminate,
}


def compile_workflow(
    term: Term,
    *,
    library: Mapping[str, Term] | None = None,
    max_call_depth: int = DEFAULT_MAX_CALL_DEPTH,
) -> Program:
    """Validate `term` and compile it (with the library workflows it calls) into a Program.

    Raises InvalidWorkflow carrying every issue `validate` finds.
    """
    issues = validate(term, library=library)
    if issues:
        raise InvalidWorkflow(issues)
    lib = dict(library or {})
    e = _Emitter(lib)
    e.term(term, term.kind)
    e.emit(Op.END, -1, term.kind)
    compiled: list[str] = []
    while e.pending_calls:  # compile each called library workflow once, after the root
        calls, e.pending_calls = e.pending_calls, []
        for ip, name in calls:
            if name not in e.entries:
                e.entries[name] = e.here()
                compiled.append(name)
                sub = lib[name]
                sub_path = f"library[{name!r}].{sub.kind}"
                e.term(sub, sub_path)
                e.emit(Op.RET, -1, sub_path)
            e.args[ip] = e.const(CallSpec(name, e.entries[name]))
    consts = tuple(e.consts)
    plain = (Op.JUMP, Op.LEAVE)  # operands that are instruction indexes, not constant slots
    code = tuple((op, arg if op in plain or arg < 0 else consts[arg]) for op, arg in zip(e.ops, e.args, strict=True))
    digest = hashlib.sha256(canonical(term).encode())
    for name in sorted(compiled):
        digest.update(f"|{name}=".encode() + canonical(lib[name]).encode())
    digest.update(f"|depth={max_call_depth}".encode())
    return Program(
        ops=tuple(e.ops),
        args=tuple(e.args),
        consts=consts,
        paths=tuple(e.paths),
        labels=tuple(e.labels),
        fingerprint=digest.hexdigest(),
        signals=frozenset(e.signals),
        persistent_signals=frozenset(e.persistent),
        regions=dict(e.regions),
        entries=dict(e.entries),
        max_call_depth=max_call_depth,
        term=term,
        code=code,
    )

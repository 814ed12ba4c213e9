"""Term -> Program: flat bytecode with resolved jumps, a constant table and a stable fingerprint.

One emitter per term kind, named `_emit_<kind>`; the table the compiler dispatches on is built from the term
classes by that name, so a construct without an emitter fails at import. The instruction layout of each
construct is drawn in `_program.py`, next to the opcodes.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Mapping
from types import CodeType
from typing import Any

from . import _netgraph, _reach
from ._errors import InvalidWorkflow
from ._outbound import Outbound
from ._program import (
    ALL,
    BYTECODE_VERSION,
    FUNCTION,
    NET_AND,
    NET_END,
    NET_OR,
    NET_XOR,
    OPERANDS,
    SPEC,
    CallSpec,
    DeferSpec,
    EffectSpec,
    InterleaveSpec,
    LoopSpec,
    MISpec,
    NameSpec,
    NetNodeSpec,
    NetRoute,
    NetSpec,
    Op,
    Program,
    RegionStepSpec,
    ReplySpec,
    SagaSpec,
    SagaStepSpec,
    ScopeSpec,
    SleepSpec,
    SplitSpec,
    WaitSpec,
    XorSpec,
)
from ._terms import (
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
)
from ._validate import validate

DEFAULT_MAX_CALL_DEPTH = 100


def _fn_id(fn: object) -> str:
    """A callable's identity for the fingerprint: its module's own name, qualified name and a digest of its code.

    Only the last part of the module's dotted name counts, so the fingerprint does not depend on how the module
    was imported: `loan_wfsub` and `app_pkg.loan_wfsub` (one file reached through two entries of `sys.path`), or
    a script run as `python app.py` and imported as `pkg.app`, give one fingerprint. The code digest tells apart
    two functions of one name in two packages."""
    module = getattr(fn, "__module__", None) or "?"
    if module == "__main__":
        module = _main_name()
    module = module.rpartition(".")[2]
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    code = _code_of(fn)
    return f"{module}.{qualname}#{_code_digest(code)}" if code is not None else f"{module}.{qualname}"


def _main_name() -> str:
    """The importable name of `__main__` (`python app.py` runs module `app`; `python -m pkg.app`, `pkg.app`), so a
    workflow compiled in a script and the same workflow imported (by `wfsub replay`, a test) agree."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return str(spec.name)
    path = getattr(main, "__file__", None)
    return os.path.splitext(os.path.basename(path))[0] if isinstance(path, str) else "__main__"


def _code_of(fn: object) -> CodeType | None:
    call = type(fn).__dict__.get("__call__")  # a callable object: the code of its class's __call__
    for candidate in (fn, getattr(fn, "__func__", None), getattr(fn, "func", None), call):
        code = getattr(candidate, "__code__", None)
        if isinstance(code, CodeType):
            return code
    return None


def _code_digest(code: CodeType) -> str:
    """The bytecode, constants and names of a code object and the code nested in it (not line numbers, so moving
    a function leaves it alone; not the values a closure captured)."""
    h = hashlib.sha256()
    stack = [code]
    while stack:
        c = stack.pop()
        h.update(c.co_code)
        h.update(repr((c.co_names, c.co_varnames, c.co_argcount, c.co_kwonlyargcount)).encode())
        for const in c.co_consts:
            if isinstance(const, CodeType):
                stack.append(const)
            else:
                h.update(repr(const).encode())
    return h.hexdigest()[:16]


def canonical(term: object) -> str:
    """Structure of a term with each function named by module and qualified name and its code's digest: the input
    of the fingerprint, so an edited task body or lambda makes a new version."""
    out: list[str] = []
    fn_ids: dict[int, str] = {}  # a function used by many steps is digested once (the term keeps it alive)

    def emit(value: object) -> None:
        if isinstance(value, Term):
            out.append(value.kind + "(")
            added = value._added
            for f in value.__dataclass_fields__:
                if f != "_hash" and f != "_added" and not (f in added and getattr(value, f) is None):
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
            known = fn_ids.get(id(value))
            if known is None:
                known = fn_ids[id(value)] = _fn_id(value)
            out.append(known)
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
        self.signal_models: dict[str, type] = {}
        self.updates: set[str] = set()  # names a wait(reply=) or a reply step answers
        self.replies: set[str] = set()  # names a reply step answers
        self.guarded = False  # some wait or defer has check=
        self.regions: dict[str, str] = {}
        self.region_paths: dict[str, tuple[str, ...]] = {}
        # Region steps address their own mi instance and call when every part of the region is written in the
        # same mi body or workflow as the step: `context` names the innermost one being emitted.
        self.context = "root"
        self.region_contexts: dict[str, set[str]] = {}
        self.region_steps: list[tuple[int, Any, str]] = []  # (spec slot, step term, context): resolved at the end
        self.node_starts: list[tuple[int, str, str]] = []  # (entry ip, name, path) of each net node: traced code
        self.flow = _reach.Flow()  # control flow the opcodes do not say: for what each instruction can reach

    def emit(self, op: Op, arg: int, path: str, label: str = "") -> int:
        self.ops.append(int(op))
        self.args.append(arg)
        self.paths.append(path)
        self.labels.append(label)
        return len(self.ops) - 1

    def const(self, value: Any) -> int:
        self.consts.append(value)
        return len(self.consts) - 1

    def region(self, name: str, kind: str, path: str) -> None:
        self.regions[name] = kind
        self.region_paths[name] = (*self.region_paths.get(name, ()), path)
        self.region_contexts.setdefault(name, set()).add(self.context)

    def in_context(self, context: str, t: Term, path: str, selector: str) -> None:
        """Emit a child that is a new mi body or workflow (a context for region steps)."""
        outer, self.context = self.context, context
        try:
            self.child(t, path, selector)
        finally:
            self.context = outer

    def resolve_region_steps(self) -> None:
        for slot, step, context in self.region_steps:
            local = self.region_contexts.get(step.name, set()) == {context}
            items = step.items if isinstance(step, AddInstances) else None
            self.set_const(slot, RegionStepSpec(step.name, local, items))

    def here(self) -> int:
        return len(self.ops)

    def arrives(self, ips: list[int], then: tuple[int, ...], *, same: bool) -> None:
        """Where a thread that reaches the ARRIVEs at `ips` goes on (`same`: it is that thread, not another)."""
        for ip in ips:
            self.flow.arrive[ip] = (then, same)

    def handler(self, t: Term | None, path: str, selector: str) -> tuple[int, int]:
        """Emit an on_cancel / on_error / compensation branch, ending in HANDLER_DONE: (its start, its
        HANDLER_DONE), or (-1, -1). Where a thread goes on after it is the caller's to say (`self.done`)."""
        if t is None:
            return -1, -1
        start = self.here()
        self.child(t, path, selector)
        return start, self.emit(Op.HANDLER_DONE, -1, path)

    def done(self, ip: int, then: tuple[int, ...], *, same: bool) -> None:
        """Where a thread goes on after the HANDLER_DONE at `ip` (`same`: that thread, else the work it undid
        ends and what follows goes on)."""
        if ip >= 0:
            self.flow.done[ip] = (then, same)

    def set_const(self, slot: int, value: Any) -> None:
        self.consts[slot] = value

    def term(self, t: Term, path: str) -> None:
        _EMIT[type(t)](self, t, path)

    def child(self, t: Term, path: str, selector: str) -> None:
        self.term(t, child_path(path, selector, t))


def _emit_task(e: _Emitter, t: Task, path: str) -> None:
    e.emit(Op.TASK, e.const(t.fn), path, _label(t))


def _emit_effect(e: _Emitter, t: Effect, path: str) -> None:
    spec = EffectSpec(t.fn, _label(t), t.timeout, t.retry, t.heartbeat_timeout)
    e.emit(Op.EFFECT, e.const(spec), path, _label(t))


def _emit_start_case(e: _Emitter, t: StartCase, path: str) -> None:
    fn = Outbound(t)  # an effect to the vm; the runtime starts the child (see `_outbound`)
    e.emit(Op.EFFECT, e.const(EffectSpec(fn, fn.label, None, None)), path, fn.label)


def _emit_signal_case(e: _Emitter, t: SignalCase, path: str) -> None:
    fn = Outbound(t)
    e.emit(Op.EFFECT, e.const(EffectSpec(fn, fn.label, None, None)), path, fn.label)


def _emit_seq(e: _Emitter, t: Seq, path: str) -> None:
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


def _emit_par(e: _Emitter, t: Par, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.PAR, slot, path)
    starts, arrives = [], []
    for i, branch in enumerate(t.branches):
        starts.append(e.here())
        e.child(branch, path, str(i))
        arrives.append(e.emit(Op.ARRIVE, -1, path))
    e.arrives(arrives, (e.here(),), same=False)
    need, policy = _need(t.join, len(t.branches))
    each = t.join == "each"
    spec = SplitSpec(tuple(starts), need, each, t.cancel_remaining, e.here(), policy=policy, blocking=t.blocking)
    e.set_const(slot, spec)


def _emit_xor(e: _Emitter, t: Xor, path: str) -> None:
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


def _emit_multi_choice(e: _Emitter, t: MultiChoice, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.MULTI_CHOICE, slot, path)
    starts, arrives = [], []
    for i, (_, branch) in enumerate(t.cases):
        starts.append(e.here())
        e.child(branch, path, str(i))
        arrives.append(e.emit(Op.ARRIVE, -1, path))
    default = -1
    if t.default is not None:
        default = e.here()
        e.child(t.default, path, "default")
        arrives.append(e.emit(Op.ARRIVE, -1, path))
    e.arrives(arrives, (e.here(),), same=False)
    spec = SplitSpec(tuple(starts), ALL, False, False, e.here(), tuple(p for p, _ in t.cases), default)
    e.set_const(slot, spec)


def _emit_loop(e: _Emitter, t: Loop, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.LOOP, slot, path)
    mode = "while" if t.while_ is not None else "until" if t.until is not None else "times"
    test = e.emit(Op.LOOP_TEST, slot, path) if mode == "while" else -1
    body = e.here()
    e.child(t.body, path, "")
    e.emit(Op.LOOP_BACK, slot, path)
    pred = t.while_ if mode == "while" else t.until
    spec = LoopSpec(mode, pred, t.times or 0, t.max_iterations, body, test, e.here())
    e.set_const(slot, spec)


def _emit_wait(e: _Emitter, t: Wait, path: str) -> None:
    e.signals.add(t.signal)
    if not t.transient:
        e.persistent.add(t.signal)
    timeout = _timer_operand(t.timeout)
    if t.model is not None:
        e.signal_models[t.signal] = t.model
    if t.reply is not None:
        e.updates.add(t.signal)
    if t.check is not None:
        e.guarded = True
    spec = WaitSpec(t.signal, t.into or t.signal, t.transient, timeout, t.reply, t.check, t.deadline)
    e.emit(Op.WAIT, e.const(spec), path)


def _emit_reply(e: _Emitter, t: Reply, path: str) -> None:
    e.updates.add(t.name)
    e.replies.add(t.name)
    e.emit(Op.REPLY, e.const(ReplySpec(t.name, t.fn)), path)


def _emit_defer(e: _Emitter, t: Defer, path: str) -> None:
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
    for name, model in t.model or ():
        e.signal_models[name] = model
    checks = dict(t.check or ())
    listed = tuple(checks.get(name) for name in names) if checks else None
    e.guarded = e.guarded or listed is not None
    e.set_const(slot, DeferSpec(tuple(names), tuple(targets), _timer_operand(t.timeout), timeout_target, listed,
                                t.deadline))


def _timer_operand(value: Any) -> Any:
    """A timer's length in a spec: seconds as a float, or the function of the data the vm calls when the step
    starts (None stays None)."""
    return value if value is None or callable(value) else float(value)


def _emit_sleep(e: _Emitter, t: Sleep, path: str) -> None:
    if t.until is not None:
        spec = SleepSpec(0.0, t.until, until=True)
    elif callable(t.seconds):
        spec = SleepSpec(0.0, t.seconds)
    else:
        spec = SleepSpec(float(t.seconds))
    e.emit(Op.SLEEP, e.const(spec), path)


def _emit_scope(e: _Emitter, t: Scope, path: str) -> None:
    e.region(t.name, "scope", path)
    slot = e.const(None)
    scope = e.emit(Op.SCOPE, slot, path)
    e.child(t.body, path, "")
    leave = e.emit(Op.LEAVE, -1, path)
    on_cancel, cancel_done = e.handler(t.on_cancel, path, "on_cancel")
    on_error, error_done = e.handler(t.on_error, path, "on_error")
    e.args[leave] = after = e.here()
    e.done(cancel_done, (after,), same=True)  # a handler's thread goes on after the scope
    e.done(error_done, (after,), same=True)
    finally_ = -1
    if t.finally_ is not None:  # every way on after the scope passes through FINALLY, which runs the branch
        fin = e.emit(Op.FINALLY, -1, path)
        finally_, finally_done = e.handler(t.finally_, path, "finally")
        e.args[fin] = e.here()
        e.done(finally_done, (e.here(),), same=True)
    # a failure, a cancel or a region step takes the body's threads to a handler, or on after the scope
    e.flow.body(scope + 1, leave, (on_cancel, on_error, finally_, after))
    e.set_const(slot, ScopeSpec(t.name, on_cancel, after, on_error, t.error_into, finally_))


def _emit_saga(e: _Emitter, t: Saga, path: str) -> None:
    slot = e.const(None)
    saga = e.emit(Op.SAGA, slot, path)
    step_slots: list[tuple[int, Any, str]] = []
    for i, step in enumerate(t.steps):
        action, compensation = step if isinstance(step, tuple) else (step, None)
        e.child(action, path, str(i))
        step_slot = e.const(None)
        e.emit(Op.SAGA_STEP, step_slot, path)
        step_slots.append((step_slot, compensation, str(i)))
    leave = e.emit(Op.LEAVE, -1, path)
    starts, dones = [], []
    for step_slot, compensation, selector in step_slots:
        where = f"{selector}.compensation"
        start, done = e.handler(compensation, path, where)
        starts.append(start)
        dones.append(done)
        name = "" if compensation is None else branch_name(compensation) or child_path(path, where, compensation)
        e.set_const(step_slot, SagaStepSpec(start, name))
    e.args[leave] = after = e.here()
    for done in dones:  # a compensation's thread ends; once the undoing is over, what follows the saga goes on
        e.done(done, (after,), same=False)
    e.flow.body(saga + 1, leave, starts)  # a failure or a cancel in the body runs the compensations
    e.set_const(slot, SagaSpec(after))


def _emit_mi(e: _Emitter, t: MI, path: str) -> None:
    if t.name is not None:
        e.region(t.name, "mi", path)
    slot = e.const(None)
    e.emit(Op.MI, slot, path)
    e.emit(Op.MI_SPAWN, slot, path)
    body = e.here()
    e.in_context(path, t.body, path, "")
    e.arrives([e.emit(Op.ARRIVE, -1, path)], (e.here(),), same=False)
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


def _emit_interleave(e: _Emitter, t: Interleave, path: str) -> None:
    slot = e.const(None)
    e.emit(Op.INTERLEAVE, slot, path)
    starts, arrives = [], []
    for i, branch in enumerate(t.branches):
        starts.append(e.here())
        e.child(branch, path, str(i))
        arrives.append(e.emit(Op.ARRIVE, -1, path))
    for i, ip in enumerate(arrives):  # the same thread runs the next branch the order allows, then goes on after
        e.arrives([ip], (*starts[:i], *starts[i + 1:], e.here()), same=True)
    names: dict[str, int] = {}
    for i, b in enumerate(t.branches):
        n = branch_name(b)
        if n is not None:
            names.setdefault(n, i)
    before: list[set[int]] = [set() for _ in t.branches]
    for a, b in t.order:
        before[b if isinstance(b, int) else names[b]].add(a if isinstance(a, int) else names[a])
    e.set_const(slot, InterleaveSpec(tuple(starts), tuple(frozenset(s) for s in before), e.here()))


def _emit_named_block(e: _Emitter, op: Op, t: Critical | Milestone, path: str) -> None:
    e.emit(op, e.const(NameSpec(t.name)), path)
    e.child(t.body, path, "")
    e.emit(Op.LEAVE, e.here() + 1, path)


def _emit_critical(e: _Emitter, t: Critical, path: str) -> None:
    _emit_named_block(e, Op.CRITICAL, t, path)


def _emit_milestone(e: _Emitter, t: Milestone, path: str) -> None:
    _emit_named_block(e, Op.MILESTONE, t, path)


def _emit_when_milestone(e: _Emitter, t: WhenMilestone, path: str) -> None:
    e.emit(Op.WHEN_MILESTONE, e.const(NameSpec(t.name)), path)
    e.child(t.branch, path, "")


def _emit_call(e: _Emitter, t: Call, path: str) -> None:
    ip = e.emit(Op.CALL, -1, path)
    e.pending_calls.append((ip, t.name))


def _emit_terminate(e: _Emitter, t: Terminate, path: str) -> None:
    e.emit(Op.TERMINATE, -1, path)


def _emit_region_step(e: _Emitter, op: Op, t: Any, path: str) -> None:
    slot = e.const(None)
    e.region_steps.append((slot, t, e.context))
    e.emit(op, slot, path)


def _emit_cancel_region(e: _Emitter, t: CancelRegion, path: str) -> None:
    _emit_region_step(e, Op.CANCEL_REGION, t, path)


def _emit_complete_region(e: _Emitter, t: CompleteRegion, path: str) -> None:
    _emit_region_step(e, Op.COMPLETE_REGION, t, path)


def _emit_add_instances(e: _Emitter, t: AddInstances, path: str) -> None:
    _emit_region_step(e, Op.ADD_INSTANCES, t, path)


def _emit_close_instances(e: _Emitter, t: CloseInstances, path: str) -> None:
    _emit_region_step(e, Op.CLOSE_INSTANCES, t, path)


_NET_KINDS = {"and": NET_AND, "xor": NET_XOR, "or": NET_OR}


def _emit_net(e: _Emitter, t: Net, path: str) -> None:
    """The nodes one after another in the plan's layout; a node's thread leaves through NET_EXIT (routing), or
    falls or jumps into its one plain successor. The nodes are a context for region steps and blocking joins,
    like an mi body: the vm keeps them per net activation."""
    plan = _netgraph.plan(t)
    graph = plan.graph
    slot = e.const(None)
    net_ip = e.emit(Op.NET, slot, path)
    n = len(graph.names)
    entries, exits, paths = [-1] * n, [-1] * n, [""] * n
    jumps: list[tuple[int, int]] = []  # (JUMP ip, node it enters)
    exit_slots: list[tuple[int, int]] = []  # (NET_EXIT spec slot, node)
    for pos, i in enumerate(plan.layout):
        name = graph.names[i]
        term = graph.terms[name]
        paths[i] = child_path(path, name, term)
        entries[i] = e.here()
        e.node_starts.append((e.here(), name, paths[i]))
        e.in_context(path, term, path, name)
        successor = plan.plain[i]
        if successor < 0:
            exit_slots.append((e.const(None), i))
            exits[i] = e.emit(Op.NET_EXIT, exit_slots[-1][0], paths[i])
            e.flow.net_of[exits[i]] = net_ip
        elif pos + 1 == len(plan.layout) or plan.layout[pos + 1] != successor:
            jumps.append((e.emit(Op.JUMP, -1, paths[i]), successor))
    for ip, successor in jumps:
        e.args[ip] = entries[successor]

    def route(name: str, node: int) -> NetRoute:
        out = graph.out[name]
        return NetRoute(
            node,
            name,
            _NET_KINDS[graph.split[name]],
            tuple(edge.pred for edge in out),
            tuple(NET_END if edge.dst == _netgraph.END else plan.index[edge.dst] for edge in out),
            tuple(plan.edge_place.get(edge.index, -1) for edge in out),
        )

    for exit_slot, i in exit_slots:
        e.set_const(exit_slot, route(graph.names[i], i))
    joins = tuple(_NET_KINDS[graph.join[name]] for name in graph.names)
    merging = [i for i, kind in enumerate(joins) if kind != NET_XOR]
    in_places: list[tuple[int, ...]] = [()] * n
    in_sources: list[tuple[str, ...]] = [()] * n
    for i in merging:
        incoming = graph.inn[graph.names[i]]
        in_places[i] = tuple(plan.edge_place[edge.index] for edge in incoming)
        in_sources[i] = tuple(edge.src for edge in incoming)
    reach: list[tuple[tuple[int, ...], ...]] = [()] * n
    for j, sets in plan.reach.items():
        reach[j] = tuple(sets)
    spec = NetSpec(
        names=tuple(graph.names),
        paths=tuple(paths),
        entries=tuple(entries),
        exits=tuple(exits),
        joins=joins,
        place_of=tuple(plan.place_of),
        in_places=tuple(in_places),
        in_sources=tuple(in_sources),
        reach=tuple(reach),
        watch=tuple(plan.watch),
        places=plan.places,
        node_places=sum(p >= 0 for p in plan.place_of),
        or_joins=tuple(i for i in merging if joins[i] == NET_OR),
        and_joins=tuple(i for i in merging if joins[i] == NET_AND),
        start=route(_netgraph.START, -1),
        after=e.here(),
    )
    e.set_const(slot, spec)


_EMIT: dict[type[Term], Callable[[_Emitter, Any, str], None]] = by_kind(globals(), "_emit_", "the compiler")


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
                e.context = f"library[{name!r}]"  # (not sub_path: that is the path, so the context, of its top mi body)
                e.term(sub, sub_path)
                e.flow.functions.append((e.entries[name], e.emit(Op.RET, -1, sub_path)))
            e.args[ip] = e.const(CallSpec(name, e.entries[name]))
    e.resolve_region_steps()
    consts = tuple(e.consts)
    in_table = {int(op) for op, kind in OPERANDS.items() if kind in (SPEC, FUNCTION)}  # operands that are slots
    code = tuple((op, consts[arg] if op in in_table else arg) for op, arg in zip(e.ops, e.args, strict=True))
    traced = code
    if e.node_starts:  # each net node's first instruction, wrapped: the traced loop records the node's start
        wrapped = list(code)
        for ip, name, path in e.node_starts:
            op, arg = code[ip]
            wrapped[ip] = (int(Op.NET_NODE), NetNodeSpec(name, path, op, arg))
        traced = tuple(wrapped)
    bits: dict[str, int] = {}
    update_waits: dict[str, tuple[str, ...]] = {}
    wait_reach: tuple[int, ...] = ()
    reply_reach: tuple[int, ...] = ()
    if e.updates:  # what each instruction can still reach, for the updates of this program (see `_reach`)
        bits = _reach.name_bits(e.updates)
        wait_reach, reply_reach = _reach.compute(code, e.flow, bits)
        update_waits = _reach.wait_paths(code, e.paths, e.updates)
    digest = hashlib.sha256(f"wfsub-bytecode-{BYTECODE_VERSION}|".encode() + canonical(term).encode())
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
        signal_models=dict(e.signal_models),
        regions=dict(e.regions),
        region_paths=dict(e.region_paths),
        entries=dict(e.entries),
        max_call_depth=max_call_depth,
        term=term,
        code=code,
        traced_code=traced,
        updates=frozenset(e.updates),
        replies=frozenset(e.replies),
        guarded=e.guarded,
        update_bits=bits,
        update_waits=update_waits,
        wait_reach=wait_reach,
        reply_reach=reply_reach,
    )

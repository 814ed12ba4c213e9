"""The bytecode format: opcodes, the operand spec of each, `Program`, and the disassembler.

The compiler writes this format and the vm reads it; neither knows the other. A program is a flat list of
instructions `(opcode, operand)`. At run time both are plain values: the opcode a small int (the `Op` enum is
for the compiler and `dis` only), the operand either an instruction index (a jump target), a function (TASK),
a frozen spec dataclass from this module, or -1 (no operand). `OPERANDS` says which, per opcode.

Layout of each construct (`s` is a constant-table slot holding the construct's spec):

    task            TASK fn
    effect          EFFECT s
    par             PAR s ; branch0 ; ARRIVE ; branch1 ; ARRIVE ... ; after:
    multi_choice    MULTI_CHOICE s ; branch0 ; ARRIVE ... ; [default ; ARRIVE] ; after:
    xor             XOR s ; case0 ; JUMP end ; case1 ; JUMP end ... ; [default] ; end:
    loop            LOOP s ; [LOOP_TEST s] (while_ only) ; body ; LOOP_BACK s ; exit:
    wait / sleep    WAIT s / SLEEP s
    defer           DEFER s ; branch0 ; JUMP end ... ; [on_timeout] ; end:
    scope           SCOPE s ; body ; LEAVE after ; [on_cancel ; HANDLER_DONE] ; [on_error ; HANDLER_DONE] ; after:
                    (with finally_: ... ; fin: FINALLY after ; finally_ ; HANDLER_DONE ; after:, and every way out
                    of the scope that goes on after it goes to `fin`)
    saga            SAGA s ; step0 ; SAGA_STEP s0 ; step1 ; SAGA_STEP s1 ... ; LEAVE after ;
                    compensation_i ; HANDLER_DONE ... ; after:
    mi              MI s ; MI_SPAWN s ; body ; ARRIVE ; after:
    interleave      INTERLEAVE s ; branch0 ; ARRIVE ; branch1 ; ARRIVE ... ; after:
    critical        CRITICAL s ; body ; LEAVE next
    milestone       MILESTONE s ; body ; LEAVE next
    when_milestone  WHEN_MILESTONE s ; branch
    call            CALL s                      (the callee: body ; RET)
    terminate       TERMINATE
    reply           REPLY s
    region steps    CANCEL_REGION s / COMPLETE_REGION s / ADD_INSTANCES s / CLOSE_INSTANCES s
    net             NET s ; node ; [NET_EXIT r | JUMP entry] ; node ; ... ; after:
                    (one node after another in `_netgraph.Plan.layout` order; a node that hands its thread to one
                    plain successor has no exit instruction when that successor comes next, else a JUMP)
The root ends with END. Library workflows reachable through `call` are compiled once each, after the root.

`Program.traced_code` is `code` with each net node's first instruction wrapped in NET_NODE (which records the
node's start, then does the wrapped instruction): the traced loop runs it, the untraced loop runs `code`, so
a chain of net nodes costs nothing per node when nobody traces. Both have the same instruction pointers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any

from ._terms import Retry, Term

BYTECODE_VERSION = 1
"""Bumped whenever the meaning of an existing program changes (an opcode's operands or effect, the vm state a
snapshot holds): part of every fingerprint and every snapshot. A new opcode is not such a change: no program stored
before it uses it, so adding one (REPLY, FINALLY) keeps the version, and with it every stored case's fingerprint."""


class Op(IntEnum):
    """Opcodes, named after the term kinds they implement (plus the few glue instructions)."""

    TASK = 0
    JUMP = 1  # glue: go to the operand
    EFFECT = 2
    END = 3  # glue: the root thread's end
    PAR = 4
    ARRIVE = 5  # glue: a branch or instance reached its end; its frame decides what follows
    XOR = 6
    MULTI_CHOICE = 7
    LOOP = 8
    LOOP_TEST = 9  # the pre-test of a while_ loop
    LOOP_BACK = 10  # the end of a loop body
    WAIT = 11
    DEFER = 12
    SLEEP = 13
    SCOPE = 14
    LEAVE = 15  # glue: leave a scope, critical section or milestone, go to the operand
    MI = 16
    INTERLEAVE = 17
    CRITICAL = 18
    MILESTONE = 19
    WHEN_MILESTONE = 20
    CALL = 21
    RET = 22  # glue: the end of a called workflow
    TERMINATE = 23
    MI_SPAWN = 24  # an mi's instance spawner: starts the next SPAWN_CHUNK instances per step
    CANCEL_REGION = 25
    COMPLETE_REGION = 26
    ADD_INSTANCES = 27
    CLOSE_INSTANCES = 28
    SAGA = 29
    SAGA_STEP = 30  # glue: a saga step completed; remember its compensation
    HANDLER_DONE = 31  # glue: the end of an on_cancel, on_error or compensation branch
    NET = 32
    NET_EXIT = 33  # a net node's thread leaves it (or starts the net): route it along the chosen edges
    NET_NODE = 34  # traced code only: a net node starts (wraps the node's first instruction)
    REPLY = 35  # answer the update this thread took at an earlier wait
    FINALLY = 36  # a scope's finally_ on the normal way out: run it as a handler, then go to the operand


TARGET = "target"  # the operand is an instruction index
FUNCTION = "function"  # the operand is the task's function
SPEC = "spec"  # the operand is a spec from this module
NONE = "none"  # no operand (-1)

OPERANDS: Mapping[Op, str] = {
    Op.TASK: FUNCTION,
    Op.JUMP: TARGET,
    Op.EFFECT: SPEC,
    Op.END: NONE,
    Op.PAR: SPEC,
    Op.ARRIVE: NONE,
    Op.XOR: SPEC,
    Op.MULTI_CHOICE: SPEC,
    Op.LOOP: SPEC,
    Op.LOOP_TEST: SPEC,
    Op.LOOP_BACK: SPEC,
    Op.WAIT: SPEC,
    Op.DEFER: SPEC,
    Op.SLEEP: SPEC,
    Op.SCOPE: SPEC,
    Op.LEAVE: TARGET,
    Op.MI: SPEC,
    Op.INTERLEAVE: SPEC,
    Op.CRITICAL: SPEC,
    Op.MILESTONE: SPEC,
    Op.WHEN_MILESTONE: SPEC,
    Op.CALL: SPEC,
    Op.RET: NONE,
    Op.TERMINATE: NONE,
    Op.MI_SPAWN: SPEC,
    Op.CANCEL_REGION: SPEC,
    Op.COMPLETE_REGION: SPEC,
    Op.ADD_INSTANCES: SPEC,
    Op.CLOSE_INSTANCES: SPEC,
    Op.SAGA: SPEC,
    Op.SAGA_STEP: SPEC,
    Op.HANDLER_DONE: NONE,
    Op.NET: SPEC,
    Op.NET_EXIT: SPEC,
    Op.NET_NODE: SPEC,
    Op.REPLY: SPEC,
    Op.FINALLY: TARGET,
}
"""What each opcode's operand is; `tests/core` checks every opcode is listed."""


# -- operand specs ----------------------------------------------------------------------------------------

ALL = -1  # join "all": needs every branch that was not withdrawn
SPAWN_CHUNK = 256  # mi instances started per vm step: a burst of `quanta` steps starts at most quanta * this
DEFAULT_MAX_INSTANCES = 100_000  # instances one mi may hold without an explicit mi(max=...)


@dataclass(frozen=True, slots=True)
class EffectSpec:
    fn: Callable[..., Any]
    name: str
    timeout: float | None
    retry: Retry | None
    heartbeat_timeout: float | None = None


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
    blocking: bool = False  # a thread re-entering waits until every branch of the current activation ended


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
    timeout: float | Callable[..., Any] | None = None  # seconds or fn(ctx) -> seconds; then a WaitTimeout failure
    reply: Callable[..., Any] | None = None  # fn(ctx) -> the answer to an update this wait takes
    check: Callable[..., Any] | None = None  # fn(ctx, payload) -> None | refusal text
    deadline: Callable[..., Any] | None = None  # fn(ctx) -> a point in time (instead of timeout); WaitTimeout


@dataclass(frozen=True, slots=True)
class DeferSpec:
    signals: tuple[str, ...]
    targets: tuple[int, ...]
    timeout: float | Callable[..., Any] | None  # seconds or fn(ctx) -> seconds
    timeout_target: int
    checks: tuple[Callable[..., Any] | None, ...] | None = None  # per signal: fn(ctx, payload) -> None | refusal
    deadline: Callable[..., Any] | None = None  # fn(ctx) -> a point in time (instead of timeout)


@dataclass(frozen=True, slots=True)
class ReplySpec:
    name: str
    fn: Callable[..., Any]  # fn(ctx) -> the update's answer (a JSON value)


@dataclass(frozen=True, slots=True)
class ScopeSpec:
    name: str
    on_cancel: int  # -1: none
    after: int
    on_error: int = -1  # -1: none
    error_into: str = "error"
    finally_: int = -1  # the finally_ branch's first instruction (it ends in HANDLER_DONE); -1: none


@dataclass(frozen=True, slots=True)
class SagaSpec:
    after: int


@dataclass(frozen=True, slots=True)
class SagaStepSpec:
    """A saga step just completed: its compensation (start ip, or -1 for none) and what to call it."""

    compensation: int
    name: str


@dataclass(frozen=True, slots=True)
class MISpec:
    count: int | None
    count_fn: Callable[..., Any] | None
    items_fn: Callable[..., Any] | None
    need: int  # ALL, n, or 0 for join=None
    cancel_remaining: bool
    min: int | None
    max: int | None
    dynamic: bool | str  # False, True, or "open"
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
    """sleep: `seconds`, or (with `fn`) fn(ctx) -> seconds, or (with `until`) fn(ctx) -> a point in time."""

    seconds: float
    fn: Callable[..., Any] | None = None
    until: bool = False


@dataclass(frozen=True, slots=True)
class RegionStepSpec:
    """A step acting on a region of its own case.

    `local`: the region is written in the same mi body (or workflow) as the step, so the step addresses only
    the activations inside its own mi instance and call; otherwise every live activation.
    """

    name: str
    local: bool
    items: Callable[..., Any] | None = None  # add_instances only


NET_AND = 0  # split: every edge; join: fires when every incoming edge holds a token
NET_XOR = 1  # split: the first edge whose predicate holds; join: every arrival starts the node
NET_OR = 2  # split: every edge whose predicate holds; join: the synchronizing merge (see `_netgraph`)
NET_END = -1  # the target of an edge into "end"


@dataclass(frozen=True, slots=True)
class NetRoute:
    """How a thread leaves a net node (or "start"): the split and, per outgoing edge in order, its predicate
    (None: always taken), the node it enters (NET_END for end) and the edge's place (-1 unless it enters an
    and/or join)."""

    node: int  # -1: start
    name: str
    split: int
    preds: tuple[Callable[..., Any] | None, ...]
    targets: tuple[int, ...]
    places: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NetSpec:
    """One net, by node index (the order of the `nodes` mapping); see `_netgraph` for places and reachable sets."""

    names: tuple[str, ...]
    paths: tuple[str, ...]  # node paths (net[name].kind)
    entries: tuple[int, ...]  # first instruction of each node
    exits: tuple[int, ...]  # NET_EXIT of each node, or -1 (a node frame's ip: its path is the node's)
    joins: tuple[int, ...]  # NET_XOR / NET_AND / NET_OR
    place_of: tuple[int, ...]  # the node's place if it is tracked (it can reach an OR-join), else -1
    in_places: tuple[tuple[int, ...], ...]  # and/or joins: the places of their incoming edges, in edge order
    in_sources: tuple[tuple[str, ...], ...]  # and/or joins: the source node of each incoming edge
    reach: tuple[tuple[tuple[int, ...], ...], ...]  # OR-joins: per incoming edge, the places that can reach it
    watch: tuple[tuple[int, ...], ...]  # per place: the OR-joins to re-check when it empties
    places: int
    node_places: int  # places below this are nodes, the others edges
    or_joins: tuple[int, ...]
    and_joins: tuple[int, ...]
    start: NetRoute
    after: int


@dataclass(frozen=True, slots=True)
class NetNodeSpec:
    """NET_NODE (traced code only): node `name` starts; then the wrapped instruction runs."""

    name: str
    path: str
    op: int
    arg: Any


# -- the program ---------------------------------------------------------------------------------------------


def signal_waits(program: Program) -> dict[str, list[str]]:
    """Each signal a workflow waits for -> the node paths of the waits and deferred choices that take it (for the
    messages that refuse a signal: the vm's, and the program summary's for a case no process here runs)."""
    found: dict[str, list[str]] = {}
    for ip, (_, arg) in enumerate(program.code):
        names = (arg.signal,) if isinstance(arg, WaitSpec) else arg.signals if isinstance(arg, DeferSpec) else ()
        for name in names:
            found.setdefault(name, []).append(program.paths[ip])
    return found


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
    signal_models: Mapping[str, type]  # signal name -> the pydantic model its payload must fit (wait(model=))
    regions: Mapping[str, str]  # region name -> "scope" | "mi"
    region_paths: Mapping[str, tuple[str, ...]]  # region name -> node paths of the scopes / mi that make it
    entries: Mapping[str, int]  # library name -> entry ip
    max_call_depth: int
    term: Term
    code: tuple[tuple[int, Any], ...]  # (opcode, operand) with operands resolved: what the vm runs
    traced_code: tuple[tuple[int, Any], ...] = ()  # what the traced loop runs (see the module docstring); () = code
    updates: frozenset[str] = frozenset()  # signal names an update can be sent to: a wait(reply=) or reply step
    replies: frozenset[str] = frozenset()  # names some reply(name) step answers (an update stays owed until then)
    guarded: bool = False  # some wait or defer has check=: taking a signal runs it (see vm/_updates)
    # What each instruction can still reach, as bitmasks over the update names (`update_bits`: name -> bit); empty
    # for a program without updates. See `_reach`.
    update_bits: Mapping[str, int] = field(default_factory=dict)
    update_waits: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # update name -> its waits' paths
    wait_reach: tuple[int, ...] = ()  # per ip: the update names whose waits or deferred choices are reachable
    reply_reach: tuple[int, ...] = ()  # per ip: the update names whose reply steps are ahead on the same thread

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def root_path(self) -> str:
        """The node path of the workflow's root (where case-level events and errors are reported)."""
        return self.term.kind

    def dis(self) -> str:
        """Readable bytecode, one instruction per line: ip, opcode, operand, what it points at, node path."""
        lines = [f"; program {self.fingerprint[:16]} ({len(self.ops)} instructions)"]
        starts = {ip: name for name, ip in self.entries.items()}
        for ip, (op, arg) in enumerate(zip(self.ops, self.args, strict=True)):
            if ip in starts:
                lines.append(f"; call target {starts[ip]!r}")
            kind = OPERANDS[Op(op)]
            if kind == TARGET:
                detail = f"-> {arg}"
            elif kind == FUNCTION:
                detail = f"s{arg} {self.labels[ip]}"
            elif kind == SPEC:
                detail = f"s{arg} {_describe(self.consts[arg])}"
            else:
                detail = ""
            lines.append(f"{ip:5d}  {Op(op).name:<14} {detail:<56} {self.paths[ip]}")
        return "\n".join(lines)


def _describe(spec: Any) -> str:
    if isinstance(spec, EffectSpec):
        return spec.name
    if isinstance(spec, NetSpec):
        return f"{len(spec.names)} nodes, {spec.places} places, after={spec.after}"
    if isinstance(spec, NetRoute):
        kind = ("and", "xor", "or")[spec.split]
        return f"{spec.name} {kind} -> " + ", ".join("end" if t == NET_END else str(t) for t in spec.targets)
    parts = []
    for f in fields(spec):
        v = getattr(spec, f.name)
        if callable(v):
            v = getattr(v, "__qualname__", "fn")
        elif isinstance(v, tuple) and v and callable(v[0]):
            v = "(" + ", ".join(getattr(p, "__qualname__", "fn") for p in v) + ")"
        parts.append(f"{f.name}={v}")
    return " ".join(parts)

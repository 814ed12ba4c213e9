"""What each instruction can still reach: the compiler's facts for updates.

Two questions about an update, answered at run time in O(threads) with no walk of the program, because the
compiler answers them once per instruction here:

- **Can a wait still take it?** (`wait_reach`) An update that no wait can take now is buffered only if some
  thread of the case can still reach a wait or deferred choice on its name; else it is refused at once (a double-
  clicked approve). The vm asks `wait_reach[ip]` of each thread's instruction.
- **Is a reply ahead?** (`reply_reach`) A thread that took an update and parks keeps its caller waiting only if a
  `reply(name, fn)` step of that name is still ahead of it on its own way (`reply_reach[ip]` of the instruction
  it parks at); otherwise the caller gets None at once.

Both are bitmasks over the program's update names (`bits`: name -> bit), one int per instruction: the union of the
names of the instructions reachable from it (itself included). Reachability is structural: predicates, loop counts
and which branches already ran are not looked at, so a loop or a net that goes back makes its earlier waits and
replies reachable again.

- The **wait graph** over-approximates everything that can happen next anywhere in the case: every branch of a
  split, every instance of an mi, every edge out of a net node, the end of a branch into what follows its join, and
  every way out of a scope or saga body that a failure, a cancel or a region step can take (its on_error,
  on_cancel, finally_, its compensations, what follows it); a failure inside a called workflow goes out through
  each call site's, and its end returns to each call site. A virtual node per scope or saga body (and per called
  workflow) stands for those ways out, so each instruction has one such edge, not one per enclosing scope. Its
  closure is Tarjan's strongly connected components (iterative: any nesting depth), O(instructions + edges).
  Over-approximating is the safe side: an update wrongly judged reachable is buffered as before; one wrongly
  judged unreachable would be refused.
- The **reply graph** follows one thread (as a reply step answers only the thread that took the update): the
  splitting thread into its first branch, never out of a branch's end into a join (another thread may carry on
  there) nor into a handler a failure or a cancel starts (a new thread runs it). Where the thread goes on at the end
  of a called workflow or of a handler depends on the activation (which call; a handler run to undo withdrawn work
  ends there), so RET and HANDLER_DONE carry the bit `exit_bit(bits)` instead of edges, and the vm follows the
  thread's call and handler frames at run time (`_vm/_updates.reply_ahead`). A call or a scope's finally_ that can
  reach its end is a summary edge to what follows it; those are solved by iterating to a fixpoint (a few passes:
  one more per nesting of loops).

The emitter records what the bytecode alone does not say (`Flow`): where each ARRIVE and HANDLER_DONE goes on, the
instruction ranges of scope and saga bodies with their ways out, which net each NET_EXIT belongs to, and the
instruction range of each called workflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._program import (
    NET_END,
    NET_XOR,
    CallSpec,
    DeferSpec,
    LoopSpec,
    MISpec,
    NetRoute,
    NetSpec,
    Op,
    SplitSpec,
    WaitSpec,
    XorSpec,
)

_PLAIN = frozenset({
    Op.TASK, Op.EFFECT, Op.WAIT, Op.SLEEP, Op.SCOPE, Op.SAGA, Op.SAGA_STEP, Op.CRITICAL, Op.MILESTONE,
    Op.WHEN_MILESTONE, Op.REPLY, Op.CANCEL_REGION, Op.COMPLETE_REGION, Op.ADD_INSTANCES, Op.CLOSE_INSTANCES,
    Op.FINALLY,
})
"""Opcodes whose thread goes on at the next instruction (after its effect, timer, signal, lock or handler)."""


class Flow:
    """What the emitter tells about control flow beyond the opcodes and their operands (see the module)."""

    __slots__ = ("arrive", "done", "bodies", "net_of", "functions")

    def __init__(self) -> None:
        # ARRIVE / HANDLER_DONE ip -> (where a thread goes on, whether it is the same thread)
        self.arrive: dict[int, tuple[tuple[int, ...], bool]] = {}
        self.done: dict[int, tuple[tuple[int, ...], bool]] = {}
        self.bodies: list[tuple[int, int, tuple[int, ...]]] = []  # (first ip, last ip, ways out) of scope/saga bodies
        self.net_of: dict[int, int] = {}  # NET_EXIT ip -> its net's NET ip
        self.functions: list[tuple[int, int]] = []  # (entry, RET ip) of each called workflow

    def body(self, first: int, last: int, ways_out: Iterable[int]) -> None:
        self.bodies.append((first, last, tuple(ip for ip in ways_out if ip >= 0)))


def name_bits(names: Iterable[str]) -> dict[str, int]:
    """Each update name -> its bit, in sorted order (the same program gives the same bits)."""
    return {name: i for i, name in enumerate(sorted(names))}


def exit_bit(bits: Mapping[str, int]) -> int:
    """The bit of `reply_reach` that says the thread can reach the end of its called workflow or handler."""
    return 1 << len(bits)


def compute(
    code: Sequence[tuple[int, Any]], flow: Flow, bits: Mapping[str, int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(`wait_reach`, `reply_reach`): per instruction, the bitmask of the update names whose waits, and whose reply
    steps (on the same thread's way), are reachable from it."""
    n = len(code)
    wait_edges: list[list[int]] = [[] for _ in range(n)]
    waits = [0] * n
    returns = _returns(code, flow)
    for ip, (op, arg) in enumerate(code):
        both, wait_only = _successors(ip, Op(op), arg, code, flow, returns)
        wait_edges[ip].extend(both)
        wait_edges[ip].extend(wait_only)
        if isinstance(arg, WaitSpec):
            waits[ip] = _mask(bits, (arg.signal,))
        elif isinstance(arg, DeferSpec):
            waits[ip] = _mask(bits, arg.signals)
    _ways_out(n, code, flow, wait_edges, waits)
    return tuple(_closure(wait_edges, waits)[:n]), _reply_reach(code, flow, bits)


def _reply_reach(code: Sequence[tuple[int, Any]], flow: Flow, bits: Mapping[str, int]) -> tuple[int, ...]:
    """The reply graph's closure (see the module), iterated to a fixpoint in reverse instruction order."""
    n = len(code)
    done = exit_bit(bits)
    own = [0] * n
    edges: list[list[int]] = [[] for _ in range(n)]
    summaries: list[tuple[int, int, int]] = []  # (ip, where its frame's code starts, where the thread goes on after)
    returns: dict[int, list[int]] = {}
    for ip, (op, arg) in enumerate(code):
        kind = Op(op)
        if kind == Op.REPLY:
            own[ip] = _mask(bits, (arg.name,))
        if kind in (Op.RET, Op.HANDLER_DONE):
            own[ip] |= done
        elif kind == Op.CALL:
            summaries.append((ip, arg.entry, ip + 1))
        elif kind == Op.FINALLY:
            summaries.append((ip, ip + 1, arg))
        else:
            edges[ip] = _successors(ip, kind, arg, code, flow, returns)[0]
    reach = list(own)
    changed = True
    while changed:
        changed = False
        for ip in range(n - 1, -1, -1):
            value = reach[ip]
            for succ in edges[ip]:
                value |= reach[succ]
            if value != reach[ip]:
                reach[ip] = value
                changed = True
        for ip, inner, after in summaries:
            found = reach[inner]
            value = reach[ip] | (found & ~done)
            if found & done:
                value |= reach[after]
            if value != reach[ip]:
                reach[ip] = value
                changed = True
    return tuple(reach)


def wait_paths(
    code: Sequence[tuple[int, Any]], paths: Sequence[str], names: Iterable[str]
) -> dict[str, tuple[str, ...]]:
    """Each update name -> the node paths of the waits and deferred choices that take it (for a refusal's text)."""
    wanted = set(names)
    found: dict[str, list[str]] = {}
    for ip, (_, arg) in enumerate(code):
        taken = (arg.signal,) if isinstance(arg, WaitSpec) else arg.signals if isinstance(arg, DeferSpec) else ()
        for name in taken:
            if name in wanted:
                found.setdefault(name, []).append(paths[ip])
    return {name: tuple(listed) for name, listed in found.items()}


def _mask(bits: Mapping[str, int], names: Iterable[str]) -> int:
    mask = 0
    for name in names:
        bit = bits.get(name)
        if bit is not None:
            mask |= 1 << bit
    return mask


def _returns(code: Sequence[tuple[int, Any]], flow: Flow) -> dict[int, list[int]]:
    """RET ip -> the instructions after each call of its workflow."""
    ret_of = {entry: ret for entry, ret in flow.functions}
    found: dict[int, list[int]] = {ret: [] for _, ret in flow.functions}
    for ip, (op, arg) in enumerate(code):
        if op == Op.CALL and isinstance(arg, CallSpec) and arg.entry in ret_of:
            found[ret_of[arg.entry]].append(ip + 1)
    return found


def _successors(
    ip: int, op: Op, arg: Any, code: Sequence[tuple[int, Any]], flow: Flow, returns: Mapping[int, list[int]]
) -> tuple[list[int], list[int]]:
    """Where a thread at `ip` goes next: (the same thread's ways, in both graphs; other threads', wait graph only)."""
    if op in _PLAIN:
        return [ip + 1], []
    if op in (Op.JUMP, Op.LEAVE):
        return [arg], []
    if op == Op.PAR:
        spec: SplitSpec = arg
        return [spec.starts[0]], list(spec.starts[1:])
    if op == Op.MULTI_CHOICE:
        spec = arg
        return [*spec.starts, *([spec.default] if spec.default >= 0 else [])], []
    if op == Op.XOR:
        xor: XorSpec = arg
        return [*xor.targets, *([xor.default] if xor.default >= 0 else [])], []
    if op in (Op.LOOP, Op.LOOP_TEST):
        loop: LoopSpec = arg
        return [ip + 1, loop.exit], []
    if op == Op.LOOP_BACK:
        loop = arg
        return [loop.test if loop.mode == "while" else loop.body, loop.exit], []
    if op == Op.DEFER:
        defer: DeferSpec = arg
        return [*defer.targets, *([defer.timeout_target] if defer.timeout_target >= 0 else [])], []
    if op == Op.MI:
        mi: MISpec = arg
        return ([mi.after] if mi.need == 0 else []), [ip + 1, mi.body, mi.after]
    if op == Op.MI_SPAWN:
        return [], [ip + 1]
    if op == Op.INTERLEAVE:
        return [*arg.starts, arg.after], []
    if op == Op.CALL:
        return [arg.entry], []
    if op == Op.RET:
        return list(returns.get(ip, ())), []
    if op == Op.NET:
        net: NetSpec = arg
        return _net_targets(net, net.start)
    if op == Op.NET_EXIT:
        return _net_targets(code[flow.net_of[ip]][1], arg)
    if op in (Op.ARRIVE, Op.HANDLER_DONE):
        targets, same = (flow.arrive if op == Op.ARRIVE else flow.done).get(ip, ((), False))
        return (list(targets), []) if same else ([], list(targets))
    return [], []  # END, TERMINATE


def _net_targets(net: NetSpec, route: NetRoute) -> tuple[list[int], list[int]]:
    """A thread leaving a net node (or starting the net) carries on into an xor-join node, or past the net's end;
    an and/or-join node is started by whichever thread fires it."""
    same, other = [], []
    for target in route.targets:
        if target == NET_END:
            same.append(net.after)
        elif net.joins[target] == NET_XOR:
            same.append(net.entries[target])
        else:
            other.append(net.entries[target])
    return same, other


def _ways_out(n: int, code: Sequence[tuple[int, Any]], flow: Flow, edges: list[list[int]], marks: list[int]) -> None:
    """Add the wait graph's ways out of scope and saga bodies and called workflows (see the module): one virtual node
    per body (its ways out, then the enclosing body's node) and per called workflow (each call site's node)."""
    bodies = sorted(flow.bodies, key=lambda b: (b[0], -b[1]))
    functions = sorted(flow.functions)
    body_node = [n + k for k in range(len(bodies))]
    fn_node = {entry: n + len(bodies) + k for k, (entry, _) in enumerate(functions)}
    edges.extend([] for _ in range(len(bodies) + len(functions)))
    marks.extend(0 for _ in range(len(bodies) + len(functions)))
    inner = [-1] * n  # each instruction's innermost way-out node
    open_: list[tuple[int, int]] = []  # (last ip, node) of the bodies around the current ip
    k = f = 0
    function = -1  # the node of the called workflow the current ip is in (-1: the root workflow)
    for ip in range(n):
        while f < len(functions) and functions[f][0] == ip:
            function = fn_node[functions[f][0]]
            f += 1
        while open_ and open_[-1][0] < ip:
            open_.pop()
        while k < len(bodies) and bodies[k][0] == ip:
            first, last, out = bodies[k]
            node = body_node[k]
            edges[node].extend(out)
            outer = open_[-1][1] if open_ else function
            if outer >= 0:
                edges[node].append(outer)
            open_.append((last, node))
            k += 1
        inner[ip] = open_[-1][1] if open_ else function
        if function >= 0 and functions[f - 1][1] == ip:
            function = -1
    for ip in range(n):
        if inner[ip] >= 0:
            edges[ip].append(inner[ip])
    for ip, (op, arg) in enumerate(code):
        if op == Op.CALL and isinstance(arg, CallSpec) and arg.entry in fn_node and inner[ip] >= 0:
            edges[fn_node[arg.entry]].append(inner[ip])


def _closure(edges: Sequence[Sequence[int]], marks: Sequence[int]) -> list[int]:
    """Per node, the union of the marks of every node reachable from it (itself included): Tarjan's strongly
    connected components, iteratively; a component is finished only after every component it reaches."""
    n = len(edges)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    comp = [-1] * n
    comp_mask: list[int] = []
    stack: list[int] = []
    counter = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, i = work[-1]
            out = edges[v]
            if i < len(out):
                work[-1] = (v, i + 1)
                w = out[i]
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                members = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = len(comp_mask)
                    members.append(w)
                    if w == v:
                        break
                mask = 0
                for w in members:
                    mask |= marks[w]
                    for x in edges[w]:
                        if comp[x] >= 0 and comp[x] != len(comp_mask):
                            mask |= comp_mask[comp[x]]
                comp_mask.append(mask)
    return [comp_mask[comp[v]] for v in range(n)]

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
  ends there), so RET and HANDLER_DONE have no edges; `exit_bit(bits)` marks the instructions from which the
  thread can reach such an end, and the vm follows the thread's call and handler frames from there at run time
  (`_vm/_updates.reply_ahead`). A call (or a scope's finally_) goes on after it only if its code can reach that
  end: which instructions can is found first, by a worklist walking the graph backwards from the ends (a call
  site joins once both its callee's entry and what follows it can); then the names' closure, as above.

The emitter records what the bytecode alone does not say (`Flow`): where each ARRIVE and HANDLER_DONE goes on, the
instruction ranges of scope and saga bodies with their ways out, which net each NET_EXIT belongs to, and the
instruction range of each called workflow.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._program import (
    NET_END,
    NET_XOR,
    CallSpec,
    DeferSpec,
    NetRoute,
    NetSpec,
    Op,
    WaitSpec,
)

_PLAIN = frozenset(int(op) for op in (
    Op.TASK, Op.EFFECT, Op.WAIT, Op.SLEEP, Op.SCOPE, Op.SAGA, Op.SAGA_STEP, Op.CRITICAL, Op.MILESTONE,
    Op.WHEN_MILESTONE, Op.REPLY, Op.CANCEL_REGION, Op.COMPLETE_REGION, Op.ADD_INSTANCES, Op.CLOSE_INSTANCES,
    Op.FINALLY,
))
"""Opcodes whose thread goes on at the next instruction (after its effect, timer, signal, lock or handler)."""

# the opcodes as the plain ints the code holds (an IntEnum compare or lookup costs several times more, per instruction)
_JUMP, _LEAVE, _PAR, _MULTI_CHOICE, _XOR = int(Op.JUMP), int(Op.LEAVE), int(Op.PAR), int(Op.MULTI_CHOICE), int(Op.XOR)
_LOOP, _LOOP_TEST, _LOOP_BACK, _DEFER = int(Op.LOOP), int(Op.LOOP_TEST), int(Op.LOOP_BACK), int(Op.DEFER)
_MI, _MI_SPAWN, _INTERLEAVE, _CALL, _RET = int(Op.MI), int(Op.MI_SPAWN), int(Op.INTERLEAVE), int(Op.CALL), int(Op.RET)
_NET, _NET_EXIT, _ARRIVE, _HANDLER_DONE = int(Op.NET), int(Op.NET_EXIT), int(Op.ARRIVE), int(Op.HANDLER_DONE)
_WAIT, _REPLY, _FINALLY = int(Op.WAIT), int(Op.REPLY), int(Op.FINALLY)


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
    steps (on the same thread's way), are reachable from it; `reply_reach` has `exit_bit(bits)` where the thread
    can reach the end of its called workflow or handler. O(instructions + edges)."""
    paused = gc.isenabled()
    if paused:  # many small lists, freed together: the collector would walk the whole heap again and again
        gc.disable()
    try:
        n = len(code)
        returns = _returns(code, flow)
        same: list[list[int]] = []
        other: list[list[int]] = []
        waits = [0] * n
        replies = [0] * n
        for ip, (op, arg) in enumerate(code):
            mine, theirs = _successors(ip, op, arg, code, flow, returns)
            same.append(mine)
            other.append(theirs)
            if op == _WAIT:
                waits[ip] = _mask(bits, (arg.signal,))
            elif op == _DEFER:
                waits[ip] = _mask(bits, arg.signals)
            elif op == _REPLY:
                replies[ip] = _mask(bits, (arg.name,))
        wait_edges = [mine + theirs for mine, theirs in zip(same, other, strict=True)]
        _ways_out(n, code, flow, wait_edges, waits)
        wait_reach = _closure(wait_edges, waits)
        return tuple(wait_reach[:n]), _reply_reach(code, same, replies, exit_bit(bits))
    finally:
        if paused:
            gc.enable()


def _reply_reach(code: Sequence[tuple[int, Any]], same: list[list[int]], replies: list[int], done: int
                 ) -> tuple[int, ...]:
    """The reply graph's closure (see the module): `same` are the same thread's ways on (changed in place)."""
    n = len(code)
    ends: list[int] = []  # RET and HANDLER_DONE: where the thread goes on is the frame's to say
    frames: list[tuple[int, int, int]] = []  # (CALL or FINALLY ip, where its code starts, where the thread goes on)
    for ip, (op, arg) in enumerate(code):
        if op in (_RET, _HANDLER_DONE):
            ends.append(ip)
            same[ip] = []
        elif op == _CALL:
            frames.append((ip, arg.entry, ip + 1))
            same[ip] = []
        elif op == _FINALLY:
            frames.append((ip, ip + 1, arg))
            same[ip] = []
    exits = _exits(n, same, ends, frames)
    for ip, inner, after in frames:  # into its code, and on after it if that code can reach its end
        same[ip] = [inner, after] if exits[inner] else [inner]
    names = _closure(same, replies)
    return tuple(found | done if exits[ip] else found for ip, found in enumerate(names))


def _exits(n: int, edges: list[list[int]], ends: list[int], frames: list[tuple[int, int, int]]) -> list[bool]:
    """Which instructions can reach the end of their frame on the same thread: backwards from `ends` over `edges`
    (without the frames' own); a frame's instruction can once both its code's start and what follows it can."""
    preds: list[list[int]] = [[] for _ in range(n)]
    for ip, out in enumerate(edges):
        for succ in out:
            preds[succ].append(ip)
    waiting: dict[int, list[tuple[int, int, int]]] = {}
    for frame in frames:
        waiting.setdefault(frame[1], []).append(frame)
        waiting.setdefault(frame[2], []).append(frame)
    exits = [False] * n
    todo = list(ends)
    for ip in ends:
        exits[ip] = True
    while todo:
        ip = todo.pop()
        for pred in preds[ip]:
            if not exits[pred]:
                exits[pred] = True
                todo.append(pred)
        for at, inner, after in waiting.get(ip, ()):
            if not exits[at] and exits[inner] and exits[after]:
                exits[at] = True
                todo.append(at)
    return exits


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
    ip: int, op: int, arg: Any, code: Sequence[tuple[int, Any]], flow: Flow, returns: Mapping[int, list[int]]
) -> tuple[list[int], list[int]]:
    """Where a thread at `ip` goes next: (the same thread's ways, in both graphs; other threads', wait graph only)."""
    if op in _PLAIN:
        return [ip + 1], []
    if op in (_JUMP, _LEAVE):
        return [arg], []
    if op == _PAR:
        return [arg.starts[0]], list(arg.starts[1:])
    if op in (_MULTI_CHOICE, _XOR):
        targets = arg.starts if op == _MULTI_CHOICE else arg.targets
        return [*targets, *([arg.default] if arg.default >= 0 else [])], []
    if op in (_LOOP, _LOOP_TEST):
        return [ip + 1, arg.exit], []
    if op == _LOOP_BACK:
        return [arg.test if arg.mode == "while" else arg.body, arg.exit], []
    if op == _DEFER:
        return [*arg.targets, *([arg.timeout_target] if arg.timeout_target >= 0 else [])], []
    if op == _MI:
        return ([arg.after] if arg.need == 0 else []), [ip + 1, arg.body, arg.after]
    if op == _MI_SPAWN:
        return [], [ip + 1]
    if op == _INTERLEAVE:
        return [*arg.starts, arg.after], []
    if op == _CALL:
        return [arg.entry], []
    if op == _RET:
        return list(returns.get(ip, ())), []
    if op == _NET:
        return _net_targets(arg, arg.start)
    if op == _NET_EXIT:
        return _net_targets(code[flow.net_of[ip]][1], arg)
    if op in (_ARRIVE, _HANDLER_DONE):
        targets, same = (flow.arrive if op == _ARRIVE else flow.done).get(ip, ((), False))
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
    connected components, iteratively (any depth); a component is finished only after every component it reaches,
    so its union is made from theirs once."""
    n = len(edges)
    index = [0] * n  # 0: not visited yet; else its visit number
    low = [0] * n
    done = [False] * n  # in a finished component (visited and not on the stack)
    reach = [0] * n
    stack: list[int] = []
    counter = 0
    for root in range(n - 1, -1, -1):  # backwards: most ways go forward, so a node's are mostly finished already
        if index[root]:
            continue
        out = edges[root]
        if all(done[w] for w in out):  # a component of its own, all it reaches finished: no search needed
            counter += 1
            index[root] = low[root] = counter
            done[root] = True
            mask = marks[root]
            for w in out:
                mask |= reach[w]
            reach[root] = mask
            continue
        counter += 1
        index[root] = low[root] = counter
        stack.append(root)
        path = [root]  # the depth-first path, with the next edge to follow of each
        at = [0]
        while path:
            v = path[-1]
            out = edges[v]
            i = at[-1]
            if i < len(out):
                at[-1] = i + 1
                w = out[i]
                if not index[w]:
                    counter += 1
                    index[w] = low[w] = counter
                    stack.append(w)
                    path.append(w)
                    at.append(0)
                elif not done[w] and index[w] < low[v]:
                    low[v] = index[w]
                continue
            path.pop()
            at.pop()
            if path and low[v] < low[path[-1]]:
                low[path[-1]] = low[v]
            if low[v] != index[v]:
                continue
            members = [stack.pop()]
            while members[-1] != v:
                members.append(stack.pop())
            for w in members:
                done[w] = True
            mask = 0
            for w in members:
                mask |= marks[w]
                for x in edges[w]:
                    mask |= reach[x]  # (a member's is still 0: its marks are in `mask` already)
            for w in members:
                reach[w] = mask
    return reach

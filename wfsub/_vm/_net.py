"""Nets in the vm: the net activation frame, the node frame, and the handlers of NET and NET_EXIT.

A thread entering a net opens a `NetFrame` (one activation: a net inside an mi has one per instance) and is
routed out of "start". Tokens then live in two kinds of place (see `wfsub/_netgraph.py`):

- **In a node.** A node that can reach an OR-join ("tracked") runs each activation in a `NodeFrame`, whose
  place count the net keeps while a thread of it is inside (a compound node holds it until its thread leaves:
  a par, an mi, an effect in flight). Any other node runs right in the net frame with no bookkeeping: a chain of
  them is laid out back to back, so its threads fall from one node into the next as through a `seq`.
- **On an edge into an and/or join.** The net frame counts them per edge (with their arrival order).

NET_EXIT routes a thread that reached the end of its node: it chooses the edges (and: all; xor: the first
whose predicate holds; or: all whose predicate holds; an edge without predicate always holds; none holding is a
failure at the node), then puts the tokens in their new places, and only then frees the old place (so a join
never sees a moment when a moving token is nowhere). The thread carries on into the first target that starts at
once (an xor-join node); the other such targets get new threads; tokens onto and/or-join edges wait there.

Joins are re-checked, never polled: an and-join when a token arrives on one of its edges; an OR-join that holds
a token when a token arrives or one of the places it watches empties (`NetSpec.watch`). The checks queued by one
event run one firing at a time, lowest node (in `nodes` order) first. A firing starts the join's node first,
then takes one token from each incoming edge that holds one (surplus tokens stay for later firings).

Cost. A step through a plain node costs what a `seq` step costs; a routed exit costs O(out-degree) plus the
re-checks it triggers. An and-join check is O(in-degree). An OR-join check scans the precomputed reachable
set of each empty incoming edge until it finds an occupied place: O(net size) at worst, paid only when a place
it watches empties while it holds a token (reachability ignores edge predicates: see `wfsub/_netgraph.py`). Only
when the activation has no thread left does it look at all its joins (O(joins)), once per standstill.

When no thread of the activation is left (every token waits at a join, reached end, or was withdrawn), the
OR-join whose oldest token arrived first fires, whatever its reachable sets say (a vicious circle of OR-joins).
When no OR-join holds a token, the tokens left at and-joins are discarded (traced), and the net finishes: done
if a token reached end (the net's thread goes on after it; the arrival that ends it carries on), else withdrawn
if any of its tokens was withdrawn, else a failure at the net naming the joins that wait. Threads, not detached
work, decide this: work a node left running unsynchronized (an `mi(join=None)`) runs on as the net's detached
work, and belongs to the case and the regions around the net like any other.

Withdrawal needs nothing special: node and net frames are ordinary frames, so a region cancelled around the net
or inside a node withdraws (and compensates) through `withdraw`/`kill_tree`; a node whose threads all ended
without leaving it frees its place and marks the activation as withdrawn.
"""

from __future__ import annotations

from collections.abc import Mapping
from heapq import heappop, heappush
from typing import TYPE_CHECKING, Any

from .. import _program as bc
from .._program import NET_AND, NET_END, NET_XOR
from ._records import Frame, Token, link, unlink, unlink_thread
from ._withdraw import refuse, step_failed

if TYPE_CHECKING:
    from ._interp import Interp

_PASS_THROUGH = (KeyboardInterrupt, SystemExit)  # as in _ops: the only exceptions a predicate may raise through


class NetFrame(Frame):
    """One activation of a net: its threads (tokens and node frames) and the tokens waiting at its joins.

    `occ[p]`: node activations holding place p (a tracked node) or tokens waiting on it (an edge into a join);
    `waiting[p - node_places]`: the arrival numbers of the tokens on an edge, oldest first; `held[j]`: the tokens
    waiting at join j (so a join that holds none is passed over in O(1)).
    """

    __slots__ = ("spec", "occ", "waiting", "held", "arrivals", "reached", "withdrawn", "finished", "checks", "busy")

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, spec: bc.NetSpec) -> None:
        super().__init__(parent, env, ip)
        self.spec = spec
        self.occ = [0] * spec.places
        self.waiting: list[list[int]] = [[] for _ in range(spec.places - spec.node_places)]
        self.held: dict[int, int] = {}  # and/or join -> tokens waiting on its edges (joins holding none absent)
        self.arrivals = 0  # numbers the tokens that wait at joins, in arrival order
        self.reached = 0  # tokens that reached end
        self.withdrawn = False  # a thread of the activation ended without leaving its node
        self.finished = False  # done, withdrawn or failed: what remains inside is detached work
        self.checks: list[int] = []  # a heap of the joins to re-check (always empty between steps)
        self.busy = False  # settle() is running (a close it causes must not settle again)

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        if self.finished:
            if self.count == 0 and self.alive:
                m._close(self, withdrawn=False)
            return
        if withdrawn:
            self.withdrawn = True
        self.settle(m, None)

    # -- places --------------------------------------------------------------------------------------------

    def check(self, j: int) -> None:
        checks = self.checks
        if j not in checks:
            heappush(checks, j)

    def vacate(self, node: int) -> None:
        """A tracked node's activation stopped holding its place: re-check the OR-joins watching it."""
        p = self.spec.place_of[node]
        occ = self.occ
        occ[p] -= 1
        if not occ[p]:
            held = self.held
            for j in self.spec.watch[p]:
                if j in held:
                    self.check(j)

    def enter(self, m: Interp, node: int, tok: Token | None) -> Token:
        """Start `node`: in a node frame of its own if it is tracked (its place is taken at once). `tok` moves
        there if given, else a new thread starts. The caller sends the thread to the node's entry."""
        spec = self.spec
        p = spec.place_of[node]
        holder: Frame = self
        if p >= 0:
            holder = NodeFrame(self, self.env, spec.exits[node], node)
            link(self, holder)
            self.occ[p] += 1
        if tok is None:
            return m._spawn(holder, spec.entries[node], self.env)
        if tok.frame is not holder:
            m._move(tok, holder)
        return tok

    def arrive_at_join(self, place: int, node: int) -> None:
        self.held[node] = self.held.get(node, 0) + 1
        self.occ[place] += 1
        self.waiting[place - self.spec.node_places].append(self.arrivals)
        self.arrivals += 1
        self.check(node)

    # -- joins ---------------------------------------------------------------------------------------------

    def can_fire(self, j: int) -> bool:
        """Whether join j fires now: an and-join when every incoming edge holds a token; an OR-join when one
        does and no occupied place can reach an empty one (`NetSpec.reach`: O(net size) at worst)."""
        if j not in self.held:
            return False
        spec = self.spec
        occ = self.occ
        if spec.joins[j] == NET_AND:
            return all(occ[p] for p in spec.in_places[j])
        reach = spec.reach[j]
        for i, p in enumerate(spec.in_places[j]):
            if not occ[p]:
                for q in reach[i]:
                    if occ[q]:
                        return False
        return True

    def fire(self, m: Interp, j: int, *, stuck: bool) -> None:
        """Join j fires: its node starts, then one token leaves each incoming edge that holds one."""
        spec = self.spec
        tok = self.enter(m, j, None)
        occ = self.occ
        held = self.held
        base = spec.node_places
        taken = []
        for source, p in zip(spec.in_sources[j], spec.in_places[j], strict=True):
            if occ[p]:
                occ[p] -= 1
                self.waiting[p - base].pop(0)
                held[j] -= 1
                taken.append(source)
                if not occ[p]:
                    for w in spec.watch[p]:
                        if w in held:
                            self.check(w)
        if not held[j]:
            del held[j]
        if m.tl:
            kind = "and" if spec.joins[j] == NET_AND else "or"
            detail: dict[str, Any] = {"node": spec.names[j], "join": kind, "edges": taken, "token": tok.tid}
            if stuck:
                detail["reason"] = "nothing else in the net can move"
            m.emit("net_join", spec.paths[j], detail)

    def oldest_or(self) -> int:
        """The OR-join holding the token that arrived first, or -1 when no OR-join holds one."""
        spec = self.spec
        base = spec.node_places
        best, oldest = -1, -1
        for j in spec.or_joins:
            if j not in self.held:
                continue
            for p in spec.in_places[j]:
                queue = self.waiting[p - base]
                if queue and (best < 0 or queue[0] < oldest):
                    best, oldest = j, queue[0]
        return best

    # -- settling --------------------------------------------------------------------------------------------

    def settle(self, m: Interp, carrier: Token | None) -> int:
        """Run the queued join checks; when no thread is left, fire the oldest OR-join or finish the net.

        `carrier`: a thread of the net that just ended at a join or at end (already unlinked). If that ends the
        net as done, it carries on after the net: the return value is where (else -1, and it is dead).
        """
        if self.busy:
            return -1
        self.busy = True
        try:
            checks = self.checks
            while True:
                while checks:
                    j = heappop(checks)
                    if self.can_fire(j):
                        self.fire(m, j, stuck=False)
                        self.check(j)  # one firing at a time: it may fire again, after any lower join
                if self.live or self.finished or not self.alive or m.ended:
                    break
                j = self.oldest_or()
                if j < 0:
                    return self.finish(m, carrier)
                self.fire(m, j, stuck=True)
                self.check(j)
        finally:
            self.busy = False
        if carrier is not None:
            carrier.alive = False
        return -1

    def finish(self, m: Interp, carrier: Token | None) -> int:
        """Nothing in the activation can move: discard what waits at and-joins, then end the net."""
        spec = self.spec
        self.finished = True
        base = spec.node_places
        waiting = []
        for j in spec.and_joins:
            if self.held.pop(j, None) is None:
                continue
            held = {s: self.occ[p] for s, p in zip(spec.in_sources[j], spec.in_places[j], strict=True) if self.occ[p]}
            empty = [s for s in spec.in_sources[j] if s not in held]
            waiting.append(
                f"the and-join {spec.names[j]!r} (holding {_listing(held)}; nothing from {', '.join(map(repr, empty))})"
            )
            for p in spec.in_places[j]:
                self.occ[p] = 0
                self.waiting[p - base].clear()
            if m.tl:
                m.emit("net_discarded", spec.paths[j], {"node": spec.names[j], "tokens": held})
        parent = self.parent
        assert parent is not None
        if self.reached:
            if carrier is not None:
                link(parent, carrier)
                carrier.frame = parent
            else:
                m._spawn(parent, spec.after, self.env)
            if self.count == 0:
                m._close(self, withdrawn=False)
            else:
                m._detach_thread(self)  # work the nodes left running unsynchronized runs on, detached
            return spec.after if carrier is not None else -1
        if carrier is not None:
            carrier.alive = False
        if self.withdrawn:
            m._end_thread(self, withdrawn=True)
            return -1
        described = "; ".join(waiting) or "nothing"
        refuse(
            m,
            self,
            self.ip,
            f"the net stopped with no token at end: nothing in it can move, and tokens wait at {described}; "
            "check the splits that feed those joins (an or join waits only for tokens that can still arrive)",
        )
        return -1


def _listing(held: dict[str, int]) -> str:
    return ", ".join(f"{n} token{'s' if n > 1 else ''} from {s!r}" for s, n in held.items())


class NodeFrame(Frame):
    """One activation of a tracked net node: it holds the node's place while a thread of it is inside."""

    __slots__ = ("node",)

    def __init__(self, parent: NetFrame, env: Mapping[str, Any], ip: int, node: int) -> None:
        super().__init__(parent, env, ip)
        self.node = node

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        if self.attached and self.live == 0:  # every thread of it ended without leaving the node: withdrawn
            net = self.parent
            assert isinstance(net, NetFrame)
            net.vacate(self.node)
            m._end_thread(self, withdrawn=True)
        elif self.count == 0:
            m._close(self, withdrawn=False)


# -- handlers -----------------------------------------------------------------------------------------------------


def _op_net(m: Interp, tok: Token, ip: int, spec: bc.NetSpec) -> int:
    parent = tok.frame
    net = NetFrame(parent, tok.env, ip, spec)
    link(parent, net)
    m._move(tok, net)
    return _route(m, net, tok, net, spec.start, ip)


def _op_net_exit(m: Interp, tok: Token, ip: int, route: bc.NetRoute) -> int:
    frame = tok.frame
    if type(frame) is NodeFrame:
        net = frame.parent
        assert isinstance(net, NetFrame)
        return _route(m, net, tok, frame, route, ip)
    assert isinstance(frame, NetFrame)
    return _route(m, frame, tok, frame, route, ip)


def _route(m: Interp, net: NetFrame, tok: Token, src: Frame, route: bc.NetRoute, ip: int) -> int:
    """`tok` leaves `src` (its node's frame, or the net for an untracked node or start) along the chosen edges."""
    chosen = _choose(m, tok, route, ip)
    if chosen is None:
        return -1
    spec = net.spec
    joins = spec.joins
    if m.tl and route.split != NET_AND:
        names = ["end" if route.targets[k] == NET_END else spec.names[route.targets[k]] for k in chosen]
        m.emit("choice", m.paths[ip], {"branches": names})
    nxt = -1
    for k in chosen:
        target = route.targets[k]
        if target == NET_END:
            net.reached += 1
            if m.tl:
                m.emit("net_end", m.paths[net.ip], {"from": route.name, "token": tok.tid})
        elif joins[target] == NET_XOR:
            if nxt < 0:
                net.enter(m, target, tok)
                nxt = spec.entries[target]
            else:
                net.enter(m, target, None)
        else:
            net.arrive_at_join(route.places[k], target)
    if nxt < 0:
        unlink_thread(tok.frame, tok)  # it ended at end or at a join: settle() decides whether it carries on
    if type(src) is NodeFrame and src.attached and src.live == 0:  # the old place is freed last
        net.vacate(src.node)
        if src.count == 0:
            src.alive = False
            unlink(net, src)
        else:
            m._detach_thread(src)  # work the node left running unsynchronized runs on, detached
    carried = net.settle(m, None if nxt >= 0 else tok)
    return nxt if nxt >= 0 else carried


def _choose(m: Interp, tok: Token, route: bc.NetRoute, ip: int) -> range | list[int] | None:
    if route.split == NET_AND:
        return range(len(route.targets))
    chosen = []
    for k, pred in enumerate(route.preds):
        if pred is not None:
            try:
                hit = bool(pred(tok.env))
            except _PASS_THROUGH:
                raise
            except BaseException as exc:  # see _ops.PASS_THROUGH
                name = getattr(pred, "__qualname__", "predicate")
                step_failed(m, tok.frame, ip, exc, f"net edge predicate {name} raised {type(exc).__name__}: {exc}")
                return None
            if not hit:
                continue
        chosen.append(k)
        if route.split == NET_XOR:
            break
    if not chosen:
        kind = "xor" if route.split == NET_XOR else "or"
        refuse(
            m,
            tok.frame,
            ip,
            f"no edge out of {route.name!r} can be taken: it is an {kind} split and none of its edge predicates "
            "holds; add an edge without a predicate (always taken) or cover every case",
        )
        return None
    return chosen

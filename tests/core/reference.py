"""A reference interpreter that walks terms directly, for differential tests against the compiled vm.

It covers task, seq, par (every join kind, cancel_remaining), xor, loop, mi and scope (without cancel
inputs), with the vm's documented scheduling under `Deterministic`: threads run first-in first-out, each
until it ends; a split carries the splitting thread into its first branch and queues the others; the
thread whose arrival fires a par join carries on; an mi queues its instances and, when its join fires, a
new thread for what follows. It shares nothing with the vm but the term classes.

Threads carry an explicit continuation (a linked list of frames) instead of a Python call stack, so any
thread can carry on after a join. Every join and mi instance counts the live threads inside it; when that
count reaches zero the region is done (a join fires with what arrived; an instance completes).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

from wfsub._terms import MI, Loop, Par, Scope, Seq, Task, Term, Xor


class Join:
    def __init__(self, term: Par, k: Any, env: Any) -> None:
        self.term, self.k, self.env = term, k, env
        self.live = len(term.branches)
        self.arrived = 0
        self.fired = False
        join = term.join
        self.each = join == "each"
        self.need = -1 if join == "all" else 1 if join in ("first", "each") else int(join)  # type: ignore[arg-type]


class MIRec:
    def __init__(self, term: MI, k: Any, env: Any, n: int) -> None:
        self.term, self.k, self.env = term, k, env
        self.outputs: list[Any] = [None] * n
        self.started = n
        self.completed = 0
        self.cancelled = 0
        self.instances_live = n
        self.fired = False
        join = term.join
        self.need = -1 if join == "all" else 0 if join is None else 1 if join == "first" else int(join)  # type: ignore[arg-type]


class Inst(Mapping[str, Any]):
    def __init__(self, rec: MIRec, index: int, item: Any, has_item: bool) -> None:
        self.rec, self.index, self.item, self.has_item = rec, index, item, has_item
        self.out: dict[str, Any] = {}
        self.live = 1
        self.arrived = 0
        self.withdrawn = False

    def __getitem__(self, key: str) -> Any:
        if key in self.out:
            return self.out[key]
        if key == "index":
            return self.index
        if key == "item" and self.has_item:
            return self.item
        return self.rec.env[key]

    def __iter__(self) -> Any:
        keys = set(self.rec.env) | set(self.out) | {"index"} | ({"item"} if self.has_item else set())
        return iter(keys)

    def __len__(self) -> int:
        return len(set(self))


class LoopAct:
    def __init__(self) -> None:
        self.iteration = 0


class Thread:
    def __init__(self, term: Any, k: Any, env: Any) -> None:
        self.term, self.k, self.env = term, k, env
        self.alive = True


class Reference:
    def __init__(self, term: Term, data: dict[str, Any] | None = None) -> None:
        self.data: dict[str, Any] = dict(data or {})
        self.ready: deque[Thread] = deque()
        self.threads: list[Thread] = []
        self.root = Thread(term, None, self.data)
        self._queue(self.root)

    # -- helpers --
    def _queue(self, th: Thread) -> None:
        self.ready.append(th)
        self.threads.append(th)

    @staticmethod
    def regions(k: Any) -> list[Any]:
        out = []
        while k is not None:
            frame, k = k
            if frame[0] in ("join", "inst"):
                out.append(frame[1])
        return out

    def spawn(self, term: Any, k: Any, env: Any) -> Thread:
        th = Thread(term, k, env)
        for region in self.regions(k):
            region.live += 1
        self._queue(th)
        return th

    def merge(self, env: Any, updates: Mapping[str, Any]) -> None:
        if env is self.data:
            self.data.update(updates)
        else:
            env.out.update(updates)

    def view(self, env: Any) -> Mapping[str, Any]:
        return env

    def die(self, th: Thread, k: Any) -> None:
        """A thread ends: every region it is in loses it; a region left empty finishes."""
        th.alive = False
        for region in self.regions(k):
            region.live -= 1
            if region.live == 0:
                self.region_empty(region)

    def region_empty(self, region: Any) -> None:
        if isinstance(region, Join):
            if not region.fired and region.arrived:
                region.fired = True
                self.spawn(None, region.k, region.env)
        elif isinstance(region, Inst):
            rec = region.rec
            if region.withdrawn:
                return
            rec.instances_live -= 1
            if region.arrived:
                rec.outputs[region.index] = region.out
                rec.completed += 1
            else:
                rec.cancelled += 1
            self.mi_check(rec)

    def mi_check(self, rec: MIRec) -> None:
        if rec.fired:
            return
        fire = rec.instances_live == 0 if rec.need < 0 else rec.completed >= rec.need or rec.instances_live == 0
        if not fire:
            return
        if rec.completed == 0 and rec.started > 0 and rec.instances_live == 0:
            return
        rec.fired = True
        if rec.term.cancel_remaining and rec.instances_live:
            for inst in rec._instances:  # type: ignore[attr-defined]
                if not inst.withdrawn and inst.live > 0:
                    inst.withdrawn = True
                    rec.cancelled += 1
            for th in self.threads:
                if th.alive and any(isinstance(r, Inst) and r.rec is rec for r in self.regions(th.k)):
                    th.alive = False
                    for region in self.regions(th.k):
                        region.live -= 1
            rec.instances_live = 0
        self.spawn(None, rec.k, rec.env)
        if rec.term.collect is not None:
            self.merge(rec.env, {rec.term.collect: list(rec.outputs)})

    # -- running --
    def run(self) -> dict[str, Any]:
        while self.ready:
            th = self.ready.popleft()
            while th.alive:
                self.step(th)
        return self.data

    def step(self, th: Thread) -> None:
        t = th.term
        if t is None:
            self.ret(th)
            return
        th.term = None
        if isinstance(t, Task):
            res = t.fn(self.view(th.env))
            if res is not None:
                self.merge(th.env, res)
        elif isinstance(t, Seq):
            th.k = (("seq", t, 1), th.k)
            th.term = t.steps[0]
        elif isinstance(t, Scope):
            th.term = t.body
        elif isinstance(t, Xor):
            for pred, branch in t.cases:
                if pred(self.view(th.env)):
                    th.term = branch
                    return
            th.term = t.default
        elif isinstance(t, Par):
            j = Join(t, th.k, th.env)
            branch_k = (("join", j), th.k)
            for region in self.regions(th.k):
                region.live += len(t.branches) - 1
            for b in t.branches[1:]:
                self._queue(Thread(b, branch_k, th.env))
            th.term = t.branches[0]
            th.k = branch_k
        elif isinstance(t, Loop):
            self.loop_enter(th, t)
        elif isinstance(t, MI):
            self.mi_start(th, t)
        else:
            raise AssertionError(f"reference does not cover {t!r}")

    def loop_enter(self, th: Thread, t: Loop) -> None:
        if t.times is not None and t.times == 0:
            return
        if t.while_ is not None and not t.while_(self.view(th.env)):
            return
        act = LoopAct()
        act.iteration = 1
        th.k = (("loop", t, act), th.k)
        th.term = t.body

    def mi_start(self, th: Thread, t: MI) -> None:
        env = self.view(th.env)
        items = list(t.items(env)) if t.items is not None else None
        n = len(items) if items is not None else (t.count(env) if callable(t.count) else t.count)
        if n == 0:
            if t.collect is not None:
                self.merge(th.env, {t.collect: []})
            return
        rec = MIRec(t, th.k, th.env, n)
        rec._instances = []  # type: ignore[attr-defined]
        outer = self.regions(th.k)
        for i in range(n):
            inst = Inst(rec, i, items[i] if items is not None else None, items is not None)
            rec._instances.append(inst)  # type: ignore[attr-defined]
            for region in outer:
                region.live += 1
            self._queue(Thread(t.body, (("inst", inst), th.k), inst))
        if rec.need == 0:
            rec.fired = True
            return
        th.alive = False  # replaced by its instances: leaves the outer regions without finishing them
        for region in outer:
            region.live -= 1

    def ret(self, th: Thread) -> None:
        if th.k is None:  # the root thread's end
            self.die(th, None)
            return
        frame, rest = th.k
        kind = frame[0]
        if kind == "seq":
            s, i = frame[1], frame[2]
            if i < len(s.steps):
                th.k = (("seq", s, i + 1), rest) if i + 1 < len(s.steps) else rest
                th.term = s.steps[i]
            else:
                th.k = rest
        elif kind == "loop":
            t, act = frame[1], frame[2]
            env = self.view(th.env)
            if t.while_ is not None:
                again = bool(t.while_(env))
            elif t.until is not None:
                again = not t.until(env)
            else:
                again = act.iteration < t.times
            if again:
                act.iteration += 1
                th.term = t.body
            else:
                th.k = rest
        elif kind == "join":
            j = frame[1]
            j.live -= 1
            j.arrived += 1
            fire = j.each or (
                not j.fired and (j.live == 0 if j.need < 0 else (j.arrived >= j.need or j.live == 0))
            )
            if fire:
                j.fired = True
                th.k = rest
                if j.term.cancel_remaining and j.live:
                    for other in self.threads:
                        if other.alive and other is not th and j in self.regions(other.k):
                            other.alive = False
                            for region in self.regions(other.k):
                                region.live -= 1
            else:
                self.die(th, rest)
        elif kind == "inst":
            inst = frame[1]
            inst.arrived += 1
            self.die(th, th.k)
        else:
            raise AssertionError(kind)

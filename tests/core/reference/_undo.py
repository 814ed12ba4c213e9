"""Withdrawal, compensation, failures and cancels: methods of `Engine`, kept apart for size.

Withdrawing a block kills everything under it. With compensation, what must be undone survives the kill as an
`Undo`, keeping how it nested: a saga whose thread is still in it with completed compensable steps, a scope with
`on_cancel` or `finally_` whose thread is still in it (and an on_error / on_cancel branch of a scope with `finally_`).
Without compensation (a region completed, a scope's thread withdrawn from inside) only the `finally_` branches
survive. Undos already running are kept as they are (a cancel never stops one).
The survivors hang under a `Compensation` block that takes the withdrawn block's place (so whatever waited for the
withdrawn work waits for them); innermost undos start first, each runs its handlers one after another, and when
the last is done the compensation performs its action (catch: store the error record and run on_error; resume:
run on_cancel in the normal flow; withdrawn / quiet: tell the parent; case_cancelled / case_failed: end the case).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _updates
from ._blocks import Block, Compensation, MIBlock, Pass, Thread, Undo

if TYPE_CHECKING:
    from ._engine import Engine


def drop(self: Engine, th: Thread) -> None:
    """A thread is withdrawn: stop what it waits for."""
    th.alive = False
    if th.park == "effect":
        self.effects.pop(th.wid, None)
    elif th.park == "timer":
        self.timers.pop(th.wid, None)
    if th.timeout:
        self.timers.pop(th.timeout, None)
        th.timeout = 0
    th.park = ""
    if self.owing:
        _updates.withdrawn(self, th)


def undo_for(self: Engine, block: Block, compensate: bool = True) -> Undo | None:
    if not block.attached or not block.alive or not isinstance(block, Pass):
        return None  # its thread left it: an ended saga is never compensated
    if block.role == "saga" and block.done and compensate:
        return Undo(block.env, block.path, list(reversed(block.done)))
    if block.role in ("scope", "handler") and block.term is not None:
        t = block.term
        queue: list[tuple[Any, str, str]] = []
        if compensate and block.role == "scope" and t.on_cancel is not None:
            queue.append((t.on_cancel, f"{block.path}[on_cancel].{t.on_cancel.kind}", f"on_cancel of scope {t.name!r}"))
        if t.finally_ is not None:
            queue.append((t.finally_, f"{block.path}[finally].{t.finally_.kind}", f"finally of scope {t.name!r}"))
        if queue:
            return Undo(block.env, block.path, queue)
    return None


def _adopt(keeper: Block | None, top: list[Block], block: Block) -> None:
    if keeper is None:
        top.append(block)
    else:
        block.parent = keeper
        keeper.add(block)


def kill_tree(self: Engine, top: Block, compensate: bool, dead: list[Block],
              keep_running: bool = False) -> list[Block]:
    """Drop every thread under `top`, list its blocks (children first) in `dead`; return the top-level kept ones."""
    keep = compensate or keep_running
    kept: list[Block] = []

    def walk(block: Block, keeper: Block | None) -> None:
        for child in block.newest_first():
            if isinstance(child, Thread):
                self.drop(child)
                continue
            if keep and isinstance(child, Undo | Compensation):
                if isinstance(child, Compensation):
                    child.action = ("nested",)  # its region is withdrawn too: its own action is void
                _adopt(keeper, kept, child)
                continue
            undo = self.undo_for(child, compensate) if keep else None
            if undo is not None:
                _adopt(keeper, kept, undo)
            walk(child, undo if undo is not None else keeper)
        block.kids = []
        block.threads = 0
        if block.alive:
            block.alive = False
            dead.append(block)

    walk(top, None)
    return kept


def withdraw(self: Engine, block: Block, compensate: bool, action: tuple[Any, ...], own: Undo | None = None) -> None:
    parent = block.parent
    assert parent is not None
    dead: list[Block] = []
    kept = self.kill_tree(block, compensate, dead)
    if own is not None:  # what the block itself undoes runs after everything inside it
        for k in kept:
            _adopt(own, [], k)
        kept = [own]
    for b in dead:
        self.on_close(b)
    attached = block.attached
    parent.kids.remove(block)
    parent.threads -= attached
    if kept:
        comp = Compensation(parent, block.env, block.path, action)
        comp.attached = attached
        parent.add(comp)
        self.start_undos(comp, kept)
    else:
        self.act(parent, block, attached, action, [])


def withdraw_inside(self: Engine, block: Block, compensate: bool, action: tuple[Any, ...],
                    keep_running: bool = False) -> int:
    """Withdraw every child of `block` (which stays); returns how many were its threads."""
    threads = 0
    dead: list[Block] = []
    kept: list[Block] = []
    for child in block.newest_first():
        threads += child.attached
        if isinstance(child, Thread):
            self.drop(child)
            continue
        if (compensate or keep_running) and isinstance(child, Undo | Compensation):
            if isinstance(child, Compensation):
                child.action = ("nested",)
            kept.append(child)
            continue
        undo = self.undo_for(child, compensate) if compensate or keep_running else None
        below = self.kill_tree(child, compensate, dead, keep_running)
        if undo is not None:
            for k in below:
                _adopt(undo, kept, k)
            kept.append(undo)
        else:
            kept.extend(below)
    block.kids = []
    block.threads = 0
    for b in dead:
        self.on_close(b)
    if kept:
        comp = Compensation(block, block.env, block.path, action)
        comp.attached = False  # withdrawn work, not a thread of the block
        block.add(comp)
        self.start_undos(comp, kept)
    elif action[0] in ("case_cancelled", "case_failed"):
        self.act(block, block, False, action, [])
    return threads


def start_undos(self: Engine, comp: Compensation, kept: list[Block]) -> None:
    todo: list[Block] = []
    for b in kept:
        b.parent = comp
        comp.add(b)
        todo.append(b)
    while todo:
        b = todo.pop()
        if isinstance(b, Undo) and not b.started:
            if not b.kids:
                self.start_undo(b)
            else:
                todo.extend(c for c in b.newest_first() if not isinstance(c, Thread))


def start_undo(self: Engine, undo: Undo) -> None:
    undo.started = True
    self.next_handler(undo)


def next_handler(self: Engine, undo: Undo) -> None:
    if not undo.queue:
        undo.current = None
        self.close(undo, False)
        return
    undo.current = undo.queue.pop(0)
    term, path, _ = undo.current
    self.spawn(undo, [(term, path)], undo.env)


def _compensation(block: Block | None) -> Compensation | None:
    while block is not None and not isinstance(block, Compensation):
        block = block.parent
    return block


def handler_finished(self: Engine, undo: Undo) -> None:
    if undo.current is not None:
        comp = _compensation(undo)
        if comp is not None:
            comp.compensated.append(undo.current[2])
    self.next_handler(undo)


def _undo_failed(self: Engine, undo: Undo, record: dict[str, Any]) -> None:
    comp = _compensation(undo)
    if comp is not None:
        comp.failures.append({"type": record["type"], "path": record["path"]})
    dead: list[Block] = []
    for child in undo.newest_first():
        if isinstance(child, Thread):
            self.drop(child)
        else:
            self.kill_tree(child, False, dead)
    undo.kids = []
    undo.threads = 0
    for b in dead:
        self.on_close(b)
    undo.current = None
    self.next_handler(undo)


def compensation_done(self: Engine, comp: Compensation) -> None:
    parent = comp.parent
    assert parent is not None
    comp.alive = False
    parent.remove(comp)
    action = comp.action
    if not comp.failures:
        self.act(parent, comp, comp.attached, action, comp.compensated)
        return
    outer = _compensation(parent)
    if action[0] == "nested" and outer is not None:
        outer.failures.extend(comp.failures)
        outer.compensated.extend(comp.compensated)
        self.child_gone(parent, comp, False)
        return
    if action[0] in ("case_cancelled", "case_failed"):
        self.end("failed", ("CompensationFailed", comp.path))
        return
    cause = action[4] if action[0] == "catch" else None
    self.fail(parent, "CompensationFailed", comp.path, "compensation failed", cause=cause,
              compensated=comp.compensated)


def act(self: Engine, parent: Block, gone: Block, attached: bool, action: tuple[Any, ...],
        compensated: list[str]) -> None:
    kind = action[0]
    if kind == "catch":
        _, scope, record = action[:3]
        record["compensated"] = list(compensated)
        t = scope.term
        self.store(gone.env, {t.error_into: record})
        self.run_handler(parent, gone, t.on_error, f"{scope.path}[on_error].{t.on_error.kind}", scope.k, record, t)
    elif kind == "resume":
        scope = action[1]
        t = scope.term
        self.run_handler(parent, gone, t.on_cancel, f"{scope.path}[on_cancel].{t.on_cancel.kind}", scope.k, None, t)
    elif kind == "withdrawn":
        self.child_gone(parent, gone, attached)
    elif kind in ("quiet", "nested"):
        self.child_gone(parent, gone, False)
    elif kind == "case_cancelled":
        self.end("cancelled")
    elif kind == "case_failed":
        assert self.failing is not None
        self.end("failed", (self.failing["type"], self.failing["path"]))


def run_handler(self: Engine, parent: Block, gone: Block, term: Any, path: str, then: list[Any],
                record: Any, scope: Any = None) -> None:
    """Run an on_cancel / on_error branch where `gone` was; at its end the thread goes on after the scope (through
    its finally_: `then` starts with it). Withdrawn before its end, the branch of a scope with finally_ runs it."""
    owner = scope if scope is not None and scope.finally_ is not None else None
    handler = Pass(parent, gone.env, gone.path, [], "handler", owner)
    handler.then = list(then)
    handler.record = record
    parent.add(handler)
    self.spawn(handler, [(term, path)], gone.env)


def fail(self: Engine, where: Block, type_name: str, path: str, message: str = "", *,
         cause: Any = None, compensated: Any = ()) -> None:
    """A failure at node `path`: the nearest scope around `where` with on_error whose thread is still in it
    catches it; uncaught, everything is withdrawn (compensating) and the case fails."""
    if self.status != "running":
        return
    record: dict[str, Any] = {"type": type_name, "message": message, "path": path,
                              "compensated": list(compensated), "cause": cause}
    block: Block | None = where
    while block is not None:
        if isinstance(block, Undo):
            _undo_failed(self, block, record)
            return
        if isinstance(block, Pass):
            if block.role == "handler":
                if record["cause"] is None and block.record is not None:
                    record["cause"] = block.record
            elif block.role == "scope" and block.attached and block.alive and block.term.on_error is not None:
                self.withdraw(block, True, ("catch", block, record))
                return
        block = block.parent
    self.failing = record
    self.withdraw_inside(self.root, True, ("case_failed",))


def cancel_case(self: Engine, compensate: bool) -> None:
    if compensate and not self.cancelling:
        self.cancelling = True
        self.withdraw_inside(self.root, True, ("case_cancelled",))
    else:
        self.end("cancelled")


def cancel_region(self: Engine, acts: list[Block]) -> None:
    for block in acts:
        if not block.alive:
            continue  # inside an activation cancelled a moment ago
        own = None
        if not block.attached:
            action: tuple[Any, ...] = ("quiet",)
        elif isinstance(block, Pass) and block.role == "scope" and block.term.on_cancel is not None:
            action = ("resume", block)
        else:
            action = ("withdrawn",)
            if isinstance(block, Pass) and block.role == "scope":
                own = self.undo_for(block, False)  # its finally_, before the cancel completes
        self.withdraw(block, True, action, own)


def complete_region(self: Engine, acts: list[Block]) -> None:
    for block in acts:
        if not block.alive:
            continue
        if isinstance(block, MIBlock):
            self.mi_fire(block, compensate=False)
            continue
        assert isinstance(block, Pass)
        dead: list[Block] = []
        kept = self.kill_tree(block, False, dead, keep_running=True)
        for b in dead:
            self.on_close(b)
        parent = block.parent
        assert parent is not None
        if not block.exited:
            self.spawn(parent, list(block.k), block.env)
        if kept:
            comp = Compensation(parent, block.env, block.path, ("quiet",))
            comp.attached = False
            parent.add(comp)
            self.start_undos(comp, kept)
        parent.remove(block)
        self.child_gone(parent, block, False)

"""Withdrawal, compensation and failure: taking work out of a case, and undoing what it did.

A withdrawn frame's work is killed in two phases (`kill_tree`: everything marked dead, then `on_close`), keeping
what must be undone (an active saga's completed steps, a scope's on_cancel) as `UndoFrame`s under a
`CompensationFrame` that stands in the withdrawn frame's place until every undo has run; then the withdrawal's
action (`act`) follows. A failure (`fail`) is caught by the nearest scope with an on_error whose thread is
inside, which is withdrawn that way; uncaught, the whole case is.

Functions of the interpreter state (`m`), called by the opcode handlers, by the state's own machinery and (through
the methods `Interp` binds to them) by the frames and the driver's front. Nothing here is on the hot path of a
step that neither fails nor withdraws anything.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .. import _program as bc
from .._errors import CompensationFailed, StepFailed, error_name
from ._records import (
    WK_EFFECT,
    WK_NONE,
    WK_SIGNAL,
    WK_TIMER,
    CompensationFrame,
    Frame,
    HandlerFrame,
    MIFrame,
    SagaFrame,
    ScopeFrame,
    Token,
    UndoFrame,
    link,
    members,
    unlink,
)
from ._result import RunStatus

if TYPE_CHECKING:
    from ._interp import Interp

CANCELLED = RunStatus.CANCELLED
FAILED = RunStatus.FAILED
_NESTED = ("nested",)
_SCOPE = int(bc.Op.SCOPE)  # the action of a compensation whose own region was withdrawn around it


# -- withdrawing ----------------------------------------------------------------------------------------------


def compensate_withdrawn(m: Interp, saga: SagaFrame | ScopeFrame) -> bool:
    """A saga whose own thread was withdrawn from inside (a region cancelled in it, a passed milestone) was
    withdrawn before it ended: its completed steps are compensated in its place before its parent hears of
    it (a scope's finally_ runs the same way; its on_cancel does not: the scope itself was not cancelled).
    False when it has nothing to undo (it then closes as any frame does)."""
    undo = _undo_for(saga, type(saga) is SagaFrame)
    if undo is None:
        return False
    saga.alive = False
    saga.on_close(m)
    parent = saga.parent
    assert parent is not None
    unlink(parent, saga)
    comp = CompensationFrame(parent, saga.env, saga.ip, ("withdrawn",))
    comp.attached = saga.attached
    link(parent, comp)
    start_undos(m, comp, [undo])
    return True


def detach(m: Interp, frame: Frame, *, withdrawn: bool) -> None:
    """Unlink a frame already killed by `kill_subtree` and tell its parent."""
    parent = frame.parent
    assert parent is not None
    unlink(parent, frame)
    parent.child_gone(m, frame, withdrawn)


def drop(m: Interp, tok: Token) -> None:
    """A token is withdrawn: stop what it waits on (the caller unlinks or discards its frame)."""
    tok.alive = False
    wk = tok.wk
    if wk == WK_EFFECT:
        if m.effects.pop(tok.wid, None) is not None:
            if type(m.out_cancel_effects) is not list:
                m.out_cancel_effects = []
            m.out_cancel_effects.append(tok.wid)
            m._trace_node("effect_cancelled", tok.ip, effect_id=tok.wid)
    elif wk == WK_TIMER:
        cancel_timer(m, tok.wid, tok.ip)
    elif wk == WK_SIGNAL and tok.aux:
        cancel_timer(m, tok.aux, tok.ip)
    tok.wk = WK_NONE
    owing = m.updates.owing if m.updates is not None else None
    if owing:  # an update this thread owes: its caller is told why (see `_updates.settle`)
        for entry in owing:
            if entry[0] is tok and len(entry) == 3:
                entry.append(m.withdrawing or f"its thread was withdrawn at {m.paths[tok.ip]}")


def withdrawing(m: Interp, why: str) -> None:
    """Say why threads are about to be withdrawn, for an update one of them owes (only then: the text is made
    only when some update is owed)."""
    if m.updates is not None and m.updates.owing:
        m.withdrawing = why


def cancel_timer(m: Interp, timer_id: int, ip: int) -> None:
    if m.timers.pop(timer_id, None) is not None:
        if type(m.out_cancel_timers) is not list:
            m.out_cancel_timers = []
        m.out_cancel_timers.append(timer_id)
        m._trace_node("timer_cancelled", ip, timer_id=timer_id)


def kill_subtree(m: Interp, frame: Frame) -> int:
    """Withdraw everything under `frame` and the frame itself, undoing nothing; returns the tokens withdrawn.

    Two phases: first every token and frame of the subtree is marked dead, then the frames release what
    they hold. A released lock is handed to a waiter only once the whole subtree is dead, so a waiter
    inside the subtree is never woken and the tree is never changed while it is being walked.
    """
    dead: list[Frame] = []
    tokens, _ = kill_tree(m, frame, False, dead)
    for f in dead:
        f.on_close(m)
    return tokens


def kill_tree(
    m: Interp, top: Frame, compensate: bool, dead: list[Frame], keep_running: bool = False
) -> tuple[int, list[Frame]]:
    """Drop every token under `top` and list its frames (top included) in `dead`, children first.

    With `compensate`, what must be undone survives: each active saga with completed compensable steps, and
    each scope with on_cancel whose thread is inside (below `top`), becomes an UndoFrame, keeping how they
    nest; compensations already running are kept as they are (a cancel never stops one). `keep_running`
    alone keeps only the compensations already running (complete_region starts none, stops none). Returns
    the tokens withdrawn and the kept frames that have no kept frame above them. An iterative walk: any depth.
    """
    keep = compensate or keep_running
    tokens = 0
    top_kept: list[Frame] = []
    stack: list[tuple[Frame, Iterator[Any], UndoFrame | None]] = [(top, members(top), None)]
    while stack:
        current, rest, keeper = stack[-1]
        for child in rest:
            if type(child) is Token:
                drop(m, child)
                tokens += 1
                continue
            undo: UndoFrame | None = None
            if keep:
                kind = type(child)
                if kind is UndoFrame or kind is CompensationFrame:
                    if kind is CompensationFrame:
                        child.action = _NESTED  # its region is withdrawn too: its own action is void
                    _adopt(keeper, top_kept, child)
                    continue
                undo = _undo_for(child, compensate)
                if undo is not None:
                    _adopt(keeper, top_kept, undo)
            grand = child.head
            while grand is not None and type(grand) is Token:
                grand = grand.next
            if grand is None:  # a frame holding only threads (an mi instance, a branch): done here, no push
                grand = child.head
                while grand is not None:
                    drop(m, grand)
                    tokens += 1
                    grand = grand.next
                child.head = None
                child.count = child.live = 0
                if child.alive:
                    child.alive = False
                    dead.append(child)
                continue
            stack.append((child, members(child), undo if undo is not None else keeper))
            break
        else:
            stack.pop()
            current.head = None
            current.count = current.live = 0
            if current.alive:
                current.alive = False
                dead.append(current)
    return tokens, top_kept


def withdraw(
    m: Interp, frame: Frame, compensate: bool, action: tuple[Any, ...], own: UndoFrame | None = None
) -> int:
    """Withdraw `frame` and all its work; then `action` (see CompensationFrame), once what must be undone is.

    The withdrawn frame's place is taken by a CompensationFrame while compensations run (it stands for the
    frame's thread, if the frame was one), so whatever waited for the withdrawn work waits for them too.
    `own`: what the frame itself undoes (a cancelled scope's finally_), after everything inside it.
    Returns the tokens withdrawn.
    """
    parent = frame.parent
    assert parent is not None
    dead: list[Frame] = []
    tokens, kept = kill_tree(m, frame, compensate, dead)
    if own is not None:
        for k in kept:
            _adopt(own, [], k)
        kept = [own]
    for f in dead:
        f.on_close(m)
    attached = frame.attached
    unlink(parent, frame)
    if kept:
        comp = CompensationFrame(parent, frame.env, frame.ip, action)
        comp.attached = attached
        link(parent, comp)
        start_undos(m, comp, kept)
    else:
        act(m, parent, frame, attached, action, [])
    return tokens


def withdraw_inside(
    m: Interp, frame: Frame, compensate: bool, action: tuple[Any, ...], keep_running: bool = False
) -> int:
    """Withdraw every child of `frame` (which stays); then `action`, once what must be undone is.

    Returns how many of the children were threads of the frame (running branches or instances). Without
    anything to undo, only the case-level actions are performed here; for the others the caller goes on.
    """
    threads = 0
    dead: list[Frame] = []
    kept: list[Frame] = []
    for child in members(frame):
        threads += child.attached
        if type(child) is Token:
            drop(m, child)
            continue
        kind = type(child)
        if (compensate or keep_running) and (kind is UndoFrame or kind is CompensationFrame):
            if kind is CompensationFrame:
                child.action = _NESTED
            kept.append(child)
            continue
        undo = _undo_for(child, compensate) if compensate or keep_running else None
        _, below = kill_tree(m, child, compensate, dead, keep_running)
        if undo is not None:
            for k in below:
                _adopt(undo, kept, k)
            kept.append(undo)
        else:
            kept.extend(below)
    frame.head = None
    frame.count = frame.live = 0
    for f in dead:
        f.on_close(m)
    if kept:
        comp = CompensationFrame(frame, frame.env, frame.ip, action)
        comp.attached = False  # withdrawn work, not a thread of the frame
        link(frame, comp)
        start_undos(m, comp, kept)
    elif action[0] in ("case_cancelled", "case_failed"):
        act(m, frame, frame, False, action, [])
    return threads


def withdraw_children(
    m: Interp, frame: Frame, reason: str, compensate: bool = True, keep_running: bool = False
) -> int:
    """Withdraw every child of `frame` (a join fired with cancel_remaining, an mi was completed); what must
    be undone is, as detached work of the frame. Returns how many children were threads of the frame."""
    if m.updates is not None and m.updates.owing:
        withdrawing(m, f"{reason} at {m.paths[frame.ip]}, withdrawing the rest of its work")
    threads = withdraw_inside(m, frame, compensate, ("quiet",), keep_running)
    m._trace_node("withdrawn", frame.ip, branches=threads, reason=reason)
    return threads


# -- compensating ---------------------------------------------------------------------------------------------


def start_undos(m: Interp, comp: CompensationFrame, kept: list[Frame]) -> None:
    """Link the kept frames under `comp` and start every UndoFrame that has nothing nested left to wait for."""
    todo: list[Frame] = []
    for frame in kept:
        frame.parent = comp
        link(comp, frame)
        todo.append(frame)
    while todo:
        frame = todo.pop()
        if type(frame) is UndoFrame and not frame.started:
            if frame.count == 0:
                start_undo(m, frame)
            else:
                todo.extend(child for child in members(frame) if type(child) is not Token)


def start_undo(m: Interp, undo: UndoFrame) -> None:
    undo.started = True
    next_handler(m, undo)


def next_handler(m: Interp, undo: UndoFrame) -> None:
    """Start the next compensation (or on_cancel) of `undo`, or close it when none is left."""
    if not undo.queue:
        undo.current = None
        m._close(undo, withdrawn=False)
        return
    undo.current = undo.queue.pop(0)
    start, name = undo.current
    m._trace_node("compensation", start, name=name, event="started")
    m._spawn(undo, start, undo.env)


def handler_finished(m: Interp, undo: UndoFrame) -> None:
    """The running handler of `undo` reached its end: note it as compensated, go on with the next."""
    if undo.current is not None:
        start, name = undo.current
        m._trace_node("compensation", start, name=name, event="done")
        comp = _compensation_frame(undo)
        if comp is not None:
            comp.compensated.append(name)
    next_handler(m, undo)


def undo_failed(m: Interp, undo: UndoFrame, record: dict[str, Any]) -> None:
    """A handler of `undo` failed: record it, stop that handler's work, and go on with the next one."""
    comp = _compensation_frame(undo)
    if comp is not None:
        comp.failures.append({"type": record["type"], "message": record["message"], "path": record["path"]})
    m._trace_node("compensation", undo.ip, event="failed", error=record["message"], at=record["path"])
    dead: list[Frame] = []
    for child in members(undo):
        if type(child) is Token:
            drop(m, child)
        else:
            kill_tree(m, child, False, dead)
    undo.head = None
    undo.count = undo.live = 0
    for f in dead:
        f.on_close(m)
    undo.current = None
    next_handler(m, undo)


def compensation_done(m: Interp, comp: CompensationFrame) -> None:
    """Every undo under `comp` has finished: perform its action, or send the failures outward."""
    parent = comp.parent
    assert parent is not None
    comp.alive = False
    unlink(parent, comp)
    action = comp.action
    if not comp.failures:
        act(m, parent, comp, comp.attached, action, comp.compensated)
        return
    outer = _compensation_frame(parent)
    if action[0] == "nested" and outer is not None:
        outer.failures.extend(comp.failures)
        outer.compensated.extend(comp.compensated)
        parent.child_gone(m, comp, False)
        return
    exc = CompensationFailed(m.paths[comp.ip], comp.failures)
    message = exc.reason
    if action[0] in ("case_cancelled", "case_failed"):
        cause: dict[str, Any] | None = None
        if action[0] == "case_failed" and m.failing is not None:
            exc.__cause__ = m.failing[1]
            cause = m.failing[3]
            cause["compensated"] = list(comp.compensated)
        kill_subtree(m, m.root)
        record = _record(exc, message, m.paths[comp.ip], comp.compensated, cause)
        record["failures"] = exc.failures  # each compensation that failed: type, message, path (`wfsub show`)
        m._set_error(comp.ip, exc, message, record)
        m._finish(FAILED, message)
        return
    cause = action[4] if action[0] == "catch" else None
    fail(m, parent, comp.ip, exc, message, cause=cause, compensated=comp.compensated)


def act(
    m: Interp, parent: Frame, gone: Frame, attached: bool, action: tuple[Any, ...], compensated: list[str]
) -> None:
    """What follows a withdrawal once its undoing is done (see CompensationFrame for the actions)."""
    kind = action[0]
    if kind == "catch":
        _, on_error, after, error_into, record = action
        record["compensated"] = list(compensated)
        m._store(gone.env, error_into, record)
        run_handler(m, parent, gone, on_error, after, record)
    elif kind == "resume":
        run_handler(m, parent, gone, action[1], action[2], None)
    elif kind == "withdrawn":
        if attached:
            m._trace_node("withdrawn", gone.ip)
        parent.child_gone(m, gone, attached)
    elif kind in ("quiet", "nested"):
        parent.child_gone(m, gone, False)
    elif kind == "case_cancelled":
        m.compensated = tuple(compensated)
        kill_subtree(m, m.root)
        m._finish(CANCELLED, action[1])
    elif kind == "case_failed":
        assert m.failing is not None
        ip, exc, message, record = m.failing
        record["compensated"] = list(compensated)
        kill_subtree(m, m.root)
        m._set_error(ip, exc, message, record)
        m._finish(FAILED, message)


def run_handler(
    m: Interp, parent: Frame, gone: Frame, start: int, then: int, record: dict[str, Any] | None
) -> None:
    """Run an on_cancel / on_error branch where `gone` was; at its end the thread goes on at `then`.

    A branch of a scope with finally_ keeps the scope's spec: withdrawn before it ends, it runs the finally_.
    """
    handler = HandlerFrame(parent, gone.env, gone.ip, then, record)
    op, spec = m.code[gone.ip]
    if op == _SCOPE and spec.finally_ >= 0:
        handler.spec = spec
    link(parent, handler)
    m._spawn(handler, start, gone.env)


# -- failures: caught by the nearest enclosing on_error, else the case fails -------------------------------


def step_failed(m: Interp, where: Frame, ip: int, exc: BaseException, message: str) -> None:
    """A step at `ip` raised `exc` (or returned something invalid); `where` is the frame its thread is in."""
    fail(m, where, ip, exc, message)


def refuse(m: Interp, where: Frame, ip: int, message: str, kind: type[StepFailed] = StepFailed) -> None:
    """The workflow cannot go on at `ip` (no branch matched, a limit was broken, a step was refused)."""
    fail(m, where, ip, kind(m.paths[ip], message), message)


def fail(
    m: Interp,
    where: Frame,
    ip: int,
    exc: BaseException,
    message: str,
    *,
    cause: dict[str, Any] | None = None,
    compensated: Sequence[str] = (),
) -> None:
    """A failure at node `ip`: the nearest scope around `where` with an on_error whose thread is still inside
    catches it (its body is withdrawn, compensating, then on_error runs); uncaught, the case fails.

    A failure inside an on_error branch names the error that branch handles as its `cause`. A failure while
    work is being undone (a compensation, or an on_cancel run while withdrawing) does not stop the others: it
    is recorded, and once all are done the failure goes outward as CompensationFailed.
    """
    if m.ended:
        return
    record: dict[str, Any] = {
        "type": error_name(exc),
        "message": message,
        "path": m.paths[ip],
        "compensated": list(compensated),
        "cause": cause,
    }
    m._trace_node("failure", ip, type=record["type"], error=message)
    frame: Frame | None = where
    while frame is not None:
        kind = type(frame)
        if kind is UndoFrame:
            undo_failed(m, frame, record)  # type: ignore[arg-type]
            return
        if kind is HandlerFrame:
            if record["cause"] is None and frame.record is not None:  # type: ignore[attr-defined]
                record["cause"] = frame.record  # type: ignore[attr-defined]
        elif kind is ScopeFrame and frame.attached and frame.alive:
            spec: bc.ScopeSpec = frame.spec  # type: ignore[attr-defined]
            if spec.on_error >= 0:
                m._trace_node("error_caught", frame.ip, error=message, at=record["path"])
                if m.updates is not None and m.updates.owing:
                    withdrawing(m, f"scope {spec.name!r} caught a failure at {record['path']} ({message}) and "
                                "runs its on_error instead")
                withdraw(m, frame, True, ("catch", spec.on_error, spec.after, spec.error_into, record))
                return
        frame = frame.parent
    m.failing = (ip, exc, message, record)
    withdraw_inside(m, m.root, True, ("case_failed",))


def end(m: Interp, status: RunStatus, ip: int, exc: BaseException | None, message: str) -> None:
    """End the case at once: no handler runs, nothing is compensated (a deadlock, an internal limit)."""
    if m.ended:
        return
    kill_subtree(m, m.root)
    if status == FAILED:
        m._set_error(ip, exc, message, None)
    m._finish(status, message)


# -- what the driver and the region steps ask for --------------------------------------------------------


def withdraw_instances(
    m: Interp, mi: MIFrame, reason: str, compensate: bool = True, keep_running: bool = False
) -> int:
    """Withdraw every instance of `mi` (and stop its spawner); returns how many instances were withdrawn."""
    spawning = mi.spawner is not None
    withdrawn = withdraw_children(m, mi, reason, compensate, keep_running)
    if spawning:
        mi.spawner = None
        mi.items = None
        mi.pending = 0
        withdrawn -= 1
    return withdrawn


def cancel_case(m: Interp, reason: str, compensate: bool) -> None:
    """Cancel the whole case: every token, effect and timer is withdrawn. With `compensate`, the active
    sagas compensate and the active scopes run their on_cancel first (innermost first); a second cancel, or
    compensate=False, ends the case at once."""
    if compensate and not m.cancelling:
        m.cancelling = True
        m._trace_node("case_cancelling", 0, reason=reason)
        withdraw_inside(m, m.root, True, ("case_cancelled", reason))
    else:
        kill_subtree(m, m.root)
        m._finish(CANCELLED, reason)


def cancel_region(m: Interp, name: str, acts: Sequence[Frame]) -> None:
    """Withdraw all work of the given live activations of region `name`, compensating what is inside.

    An activation whose thread already went on (a scope the thread left while a discriminator's loser
    still runs inside, an mi whose join fired) only loses that leftover work: what follows it does
    not run again, and `on_cancel` does not run.
    """
    withdrawing(m, f"region {name!r} was cancelled")
    for frame in acts:
        if not frame.alive:
            continue  # inside an activation cancelled a moment ago
        own: UndoFrame | None = None
        if not frame.attached:
            action: tuple[Any, ...] = ("quiet",)
        elif isinstance(frame, ScopeFrame) and frame.spec.on_cancel >= 0:
            action = ("resume", frame.spec.on_cancel, frame.spec.after)  # after: its finally_, if any
        else:
            action = ("withdrawn",)
            if isinstance(frame, ScopeFrame):
                own = _undo_for(frame, False)  # its finally_ runs before the cancel completes
        tokens = withdraw(m, frame, True, action, own)
        m._trace_node("region_cancelled", frame.ip, region=name, tokens=tokens)


def complete_region(m: Interp, name: str, acts: Sequence[Frame]) -> None:
    """Close the given activations of region `name` now (they were checked: none refuses)."""
    withdrawing(m, f"region {name!r} was completed")
    for frame in acts:
        if not frame.alive:
            continue  # inside an activation completed a moment ago
        # Completing starts no compensation, and stops none already running: those go on as detached work.
        if isinstance(frame, MIFrame):
            frame.cancelled += withdraw_instances(m, frame, "region completed", compensate=False, keep_running=True)
            m._trace_node("region_completed", frame.ip, region=name)
            m._mi_fire(frame)  # closes the mi, or detaches it while kept compensations run
        else:
            assert isinstance(frame, ScopeFrame)
            dead: list[Frame] = []
            _, kept = kill_tree(m, frame, False, dead, keep_running=True)
            for f in dead:
                f.on_close(m)
            m._trace_node("region_completed", frame.ip, region=name)
            parent = frame.parent
            assert parent is not None
            if not frame.exited:  # else the thread already went on: only its leftover work is withdrawn
                m._spawn(parent, frame.spec.after, frame.env)
            if kept:
                comp = CompensationFrame(parent, frame.env, frame.ip, ("quiet",))
                comp.attached = False  # withdrawn work of the scope's parent, not a thread of it
                link(parent, comp)
                start_undos(m, comp, kept)
            detach(m, frame, withdrawn=False)



def _adopt(keeper: Frame | None, top_kept: list[Frame], frame: Frame) -> None:
    """Hang a kept frame under the nearest kept frame above it, or list it as a top-level one."""
    if keeper is None:
        top_kept.append(frame)
    else:
        frame.parent = keeper
        link(keeper, frame)



def _undo_for(frame: Frame, compensate: bool = True) -> UndoFrame | None:
    """The UndoFrame a withdrawn frame leaves behind, if it has something to undo (see kill_tree).

    Without `compensate` (a region completed, a scope's thread withdrawn from inside) only a scope's finally_
    runs: no saga compensates and no on_cancel runs. A scope's finally_ runs after its on_cancel; an on_error or
    on_cancel branch of a scope with finally_ that is withdrawn before its end runs that finally_.
    """
    if not frame.attached or not frame.alive:
        return None  # its thread left it (or it ended): an ended saga is never compensated
    kind = type(frame)
    if type(frame) is SagaFrame:
        done = [(start, name) for start, name in frame.done if start >= 0] if compensate else []
        if done:
            return UndoFrame(frame.env, frame.ip, done[::-1])
    elif (type(frame) is ScopeFrame or type(frame) is HandlerFrame) and frame.spec is not None:
        spec: bc.ScopeSpec = frame.spec
        queue: list[tuple[int, str]] = []
        if compensate and kind is ScopeFrame and spec.on_cancel >= 0:
            queue.append((spec.on_cancel, f"on_cancel of scope {spec.name!r}"))
        if spec.finally_ >= 0:
            queue.append((spec.finally_, f"finally of scope {spec.name!r}"))
        if queue:
            return UndoFrame(frame.env, frame.ip, queue)
    return None



def _compensation_frame(frame: Frame | None) -> CompensationFrame | None:
    while frame is not None and type(frame) is not CompensationFrame:
        frame = frame.parent
    return frame



def _record(
    exc: BaseException, message: str, path: str, compensated: list[str], cause: dict[str, Any] | None
) -> dict[str, Any]:
    return {"type": error_name(exc), "message": message, "path": path, "compensated": compensated, "cause": cause}


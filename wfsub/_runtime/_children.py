"""Child cases (`start_case`) and signals to other cases (`signal_case`): what the runtime does for the effect
these steps compile to (see `wfsub._outbound`).

To the vm, the journal and recovery each step is an effect at its node path: its outcome (the child's result or
id, the signal's acceptance, or the error) is journaled as an `effect` record, replay feeds it back, and a step
whose outcome was not recorded before a crash is attempted again after recovery. So each is attempted at least
once, and is applied once because of its key:

- `start_case`: the child's case id is the key. Starting is idempotent by id (a durable start writes the child's
  `start` record and row, with `parent`, in one transaction): a second attempt finds the child and goes on with
  it, whichever attempt wrote it, even when the data it computes now differs (the case with that id and this
  parent *is* the child). An id held by a case of another parent fails the step with CaseExists. The default id
  is `{parent id}/{node path}` plus `/{index}` for each mi instance around the step (outermost first); a step that
  runs more than once in one instance (a loop, a net cycle) needs `case_id=` giving each run its own id, or each
  run finds the first run's child.
- `signal_case`: the signal's `request_id` is the key: `{parent id}:{effect id}:{node path}`, the step's effect
  idempotency key (deterministic: the same on every attempt, replay and recovery, and distinct for each run of
  the step). A signal already applied with it is not applied again.

Waiting for a child (`wait=True`) is awaiting its end through the Substrate (`await_case`), wherever the child
runs: in memory here, parked in the store, or owned by another node of a shared Postgres store. A child that ends
elsewhere is learnt through the store: the end of a case is published (NOTIFY, re-read after each reconnect and
polled every second) to every node's awaiters, so the parent's step wakes with the child's outcome and posts it
to its case as an effect outcome. When the parent is recovered (after a crash, or by another node after a
takeover) its in-flight step is attempted again: the start finds the child, and the step waits again, so a
child that ended meanwhile answers at once from its row. A parent that waits keeps an effect in flight, so it is
never evicted from memory while it waits.

A child's outcome: its final data (merged into the parent's data `into` a key, or into the data itself), or a
failure of the step with `CaseFailed` (the child failed) or `CaseCancelled` (the child was cancelled), which
`scope(on_error=)` catches. With `on_parent_cancel="cancel"` (the default), a parent that withdraws the waiting
step (the parent or the step's region is cancelled, a failure elsewhere withdraws it, `terminate()`) cancels the
child, with compensation; `"abandon"` leaves it running. A Substrate closing or a case leaving this node is not a
withdrawal: the step stays in flight in the store and the child runs on. The child's cancel is sent when the
parent's step is withdrawn; a process that dies between the two leaves the child running (cancel it by hand, or
find it with `cases(parent=)`).

Transient store trouble (StoreError) while starting, signalling or waiting is retried with a capped backoff on
the Substrate's clock; a Substrate that closes meanwhile leaves the step in flight, to be attempted again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import (
    CaseCancelled,
    CaseExists,
    CaseFailed,
    CaseNotFound,
    StoreError,
    SubstrateClosed,
    WfsubError,
    not_our_child,
    outbound_value,
)
from .._outbound import Outbound
from .._terms import SignalCase, StartCase
from .._trace import get_logger
from .._vm._records import InstanceFrame
from ._status import CaseStatus

if TYPE_CHECKING:
    from .._store import Store
    from .._vm import EffectRequest
    from ._case import CaseActor
    from ._substrate import Substrate

_log = get_logger("wfsub.runtime")

CHILDREN_SHOWN = 1000
"""`status().children` lists at most this many (the oldest); `cases(parent=)` pages through every child."""

_BACKOFF_CAP = 5.0


def outbound(actor: CaseActor, req: EffectRequest) -> Callable[[Mapping[str, Any]], Awaitable[Any]]:
    """The function to run for the effect `req`: its own for an effect, the step's action for start_case and
    signal_case."""
    fn = req.fn
    if type(fn) is not Outbound:
        return fn
    term = fn.term
    if isinstance(term, StartCase):
        return lambda ctx: _start_case(actor, req, term, ctx)
    assert isinstance(term, SignalCase)
    return lambda ctx: _signal_case(actor, req, term, ctx)


def instance_indexes(ctx: Mapping[str, Any]) -> list[int]:
    """The index of each mi instance whose data `ctx` is, outermost first."""
    found: list[int] = []
    env: Any = ctx
    while isinstance(env, InstanceFrame):
        found.append(env.index)
        parent = env.parent
        assert parent is not None
        env = parent.env
    found.reverse()
    return found


def default_child_id(parent: str, path: str, ctx: Mapping[str, Any]) -> str:
    return f"{parent}/{path}" + "".join(f"/{i}" for i in instance_indexes(ctx))


def children_in(sub: Substrate, status: CaseStatus) -> CaseStatus:
    """`status` with the ids of the cases that case started (oldest first, at most CHILDREN_SHOWN)."""
    store = sub._store
    if store is None:
        found = sub._children.get(status.case_id)
        return status.model_copy(update={"children": tuple(found[:CHILDREN_SHOWN])}) if found else status
    if sub._phase != "open":  # closed: its store is too; what it read last stands (status() works after close)
        found = sub._children.get(status.case_id)
        return status.model_copy(update={"children": tuple(found)}) if found else status
    rows = store.read_cases(parent=status.case_id, limit=CHILDREN_SHOWN)
    if not rows:
        return status
    children = tuple(row.case_id for row in reversed(rows))
    sub._children[status.case_id] = list(children)  # (kept for a status read after the Substrate closed)
    return status.model_copy(update={"children": children})


async def stored_children(store: Store, status: CaseStatus) -> CaseStatus:
    """`status` with the ids of the cases that case started as its store lists them (a Client's `status()`)."""
    rows = await store.cases(parent=status.case_id, limit=CHILDREN_SHOWN)
    if not rows:
        return status
    return status.model_copy(update={"children": tuple(row.case_id for row in reversed(rows))})


async def _persist(actor: CaseActor, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
    """`call()`, tried again after a StoreError (a store outage must not fail the step); a Substrate closing
    meanwhile leaves the step in flight: it waits here to be cancelled with its case's task group."""
    delay = 0.05
    clock = actor.shared.clock
    while True:
        try:
            return await call()
        except SubstrateClosed:
            await anyio.sleep_forever()
        except StoreError as exc:  # (a StoreConflict too: the case moved to another node; sent again, it goes there)
            _log.warning("store trouble; trying again", case_id=actor.case_id, action=what, error=str(exc),
                         delay=delay)
            await clock.sleep(delay)
            delay = min(delay * 2, _BACKOFF_CAP)


def _label(t: StartCase | SignalCase) -> str:
    return f"start_case({t.workflow!r})" if isinstance(t, StartCase) else f"signal_case({t.name!r})"


async def _start_case(actor: CaseActor, req: EffectRequest, t: StartCase, ctx: Mapping[str, Any]) -> Any:
    sub: Substrate = actor.shared.substrate
    parent = actor.case_id
    label = _label(t)
    if t.case_id is not None:
        child_id = t.case_id(ctx)
        if not isinstance(child_id, str) or not child_id:
            raise outbound_value(label, req.path, "case_id(ctx) must return a non-empty str", child_id,
                                 "return the id the child case should have", parent)
    else:
        child_id = default_child_id(parent, req.path, ctx)
    data = t.data(ctx) if t.data is not None else None
    if data is not None and not isinstance(data, Mapping):
        raise outbound_value(label, req.path, "data(ctx) must return a mapping (the child's start data) or None",
                             data, "return a dict", parent)

    async def start() -> None:
        # A child an earlier attempt started is found first (not started again: a start repeated while the child
        # is being brought back into memory would race with the inputs that bring it back).
        found, other = _existing(sub, child_id)
        if found:
            if other != parent:
                raise not_our_child(child_id, parent, req.path, other)
            return
        # Shielded: a withdrawal while the start is being written waits for it, so the child it may cancel exists.
        with anyio.CancelScope(shield=True):
            try:
                await sub.new_case(t.workflow, data, case_id=child_id, _parent=parent)
            except CaseExists:
                found, other = _existing(sub, child_id)
                if other != parent:
                    raise not_our_child(child_id, parent, req.path, other) from None

    try:
        await _persist(actor, f"start child {child_id!r}", start)
        if not t.wait:
            return {t.into or "child": child_id}
        result = await _persist(actor, f"await child {child_id!r}", lambda: sub.await_case(child_id))
    except CaseFailed as exc:  # a copy: the child's own exception object is handed to its other awaiters too
        failed = CaseFailed(exc.case_id, exc.path, exc.reason)
        failed.record, failed.traceback = exc.record, exc.traceback
        raise failed from exc.__cause__
    except CaseCancelled as exc:
        raise CaseCancelled(exc.case_id, exc.reason) from None
    except anyio.get_cancelled_exc_class():
        if t.wait and t.on_parent_cancel == "cancel" and _withdrawn(actor, req, sub):
            await _cancel_child(actor, req, sub, child_id)
        raise
    return result if t.into is None else {t.into: result}


def _existing(sub: Substrate, case_id: str) -> tuple[bool, str | None]:
    """Whether a case `case_id` exists (in memory or in the store), and its parent."""
    try:
        return True, sub._status(case_id).parent
    except CaseNotFound:
        return False, None


def _withdrawn(actor: CaseActor, req: EffectRequest, sub: Substrate) -> bool:
    """Whether the step's effect was cancelled because its case withdrew it (not because the case left memory or
    the Substrate is closing)."""
    return (
        req.effect_id not in actor.requested and not actor.closed and actor.stale is None and not actor.evicting
        and sub._phase == "open"
    )


async def _cancel_child(actor: CaseActor, req: EffectRequest, sub: Substrate, child_id: str) -> None:
    with anyio.move_on_after(10, shield=True):
        try:
            await sub.cancel(child_id, compensate=True, reason=f"its parent {actor.case_id!r} was cancelled",
                             request_id=f"{actor.case_id}:{req.effect_id}:{req.path}:cancel")
        except WfsubError as exc:  # (ended already, or the store is out: it is logged, the parent goes on)
            _log.info("child not cancelled", case_id=actor.case_id, child=child_id, error=str(exc))


async def _signal_case(actor: CaseActor, req: EffectRequest, t: SignalCase, ctx: Mapping[str, Any]) -> Any:
    sub: Substrate = actor.shared.substrate
    label = _label(t)
    target = t.case_id(ctx)
    if not isinstance(target, str) or not target:
        raise outbound_value(label, req.path, "case_id(ctx) must return a non-empty str", target,
                             "return the id of the case to signal", actor.case_id)
    payload = t.payload(ctx) if t.payload is not None else None
    request_id = f"{actor.case_id}:{req.effect_id}:{req.path}"
    await _persist(actor, f"signal case {target!r}", lambda: sub.signal(target, t.name, payload,
                                                                        request_id=request_id))
    return None

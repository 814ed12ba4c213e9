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
parent's step is withdrawn, with the request id `{parent}:{effect id}:{node path}:cancel`, and sent again until it
is delivered or the child has ended (`cancel_child`: while the store fails, a task beside the cases keeps trying
with a capped backoff; the request id applies it once). A child the parent waits
for with "cancel" says so in its `start` record (`cancel_with_parent`) and names the parent's step there and in
its row (`parent_step`: effect id and node path), so a cancel lost with a process that died before sending it is
sent by the next Substrate to open the store, and by a node of a shared store after it takes cases over
(`cancel_lost_children`), with compensation, once (a cancel with the same request id is applied once):
- the parent has ended (cancelled, failed, terminated): every such child of it is cancelled (request id: the
  step's, or `{parent}:ended:cancel:{child}` for a child started before children named their parent's step);
- the parent lives on (one of this node's) but no longer has that step in flight (its region was cancelled, a
  timeout or another branch withdrew it): the parent is brought into memory if it is not there (its journal,
  replayed, says which steps are in flight) and each child whose step it withdrew is cancelled. A child whose
  step is still in flight is left alone. Children started before rows named the parent's step are not looked
  for this way (find them with `cases(parent=)`).
This look runs before the look for children of ended parents, so a parent that ends while they run (one
recovered while it compensated a cancel ends when its compensation completes) is found by one or the other.

A child queued (`start_case(..., queue=)`) is cancelled in its queue. A cancel that comes while its queue has
claimed it and not yet written its start waits for that start, and goes to the case. A child waited for with
"cancel" that starts from its queue checks, as it starts, that its parent (when it is this node's) still has the
step in flight, and is cancelled if not: a look for lost cancels running meanwhile saw it nowhere.

Transient store trouble (StoreError) while starting, signalling or waiting is retried with a capped backoff on
the Substrate's clock; a Substrate that closes meanwhile leaves the step in flight, to be attempted again. A
refusal the store would repeat however often it is asked (`refused_for_good`: on Postgres a data exception, an
integrity violation or a program limit, SQLSTATE classes 22, 23, 54) fails the step with the store's reason
instead. A child id no case may have (`check_case_id`) fails the step before anything is sent, and so does a
target id of `signal_case` that no store could hold. Request ids derived from case ids (`signal_case`'s, a child's
cancel) go through `derived_request_id`, which keeps them within the bound every store indexes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

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
    store_refused,
    unknown_name,
)
from .._outbound import Outbound
from .._program import EffectSpec, Program
from .._store import Listing, Store, refused_for_good
from .._terms import SignalCase, StartCase, Term, child_path, children
from .._trace import get_logger
from .._vm import InstanceFrame
from . import _inputs as inputs
from ._compact import start_of
from ._control import Remote
from ._journal import parent_step_of
from ._start_request import StartRequest
from ._status import FINAL, CaseState, CaseStatus

if TYPE_CHECKING:
    from .._store import Store
    from .._vm import EffectRequest
    from ._case import CaseActor
    from ._registry import Workflows
    from ._table import CaseTable

_log = get_logger("wfsub.runtime")

CHILDREN_SHOWN = 1000
"""`status().children` lists at most this many (the oldest); `cases(parent=)` pages through every child."""

_BACKOFF_CAP = 5.0


class Steering(Protocol):
    """What `start_case` and `signal_case` steps, and the looks for lost cancels, need of their Substrate: its
    table of cases, and the routes of a start, a signal, a cancel and an await (each as the API checks them)."""

    @property
    def table(self) -> CaseTable: ...

    async def start(self, req: StartRequest) -> object: ...

    async def await_case(self, case_id: str) -> Any: ...

    async def signal(self, case_id: str, name: str, payload: Any, request_id: str) -> None: ...

    async def cancel(self, case_id: str, reason: str, request_id: str) -> None: ...

    async def live(self, case_id: str, what: str) -> CaseActor: ...

    def status(self, case_id: str) -> CaseStatus: ...


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


def children_in(table: CaseTable, status: CaseStatus) -> CaseStatus:
    """`status` with the ids of the cases that case started (oldest first, at most CHILDREN_SHOWN)."""
    store = table.store
    if store is None:
        found = table.children.get(status.case_id)
        return status.model_copy(update={"children": tuple(found[:CHILDREN_SHOWN])}) if found else status
    if table.phase != "open" or not _may_start_children(table.workflows, status):
        # closed (its store is too: what it read last stands), or a version with no start_case: nothing to read
        found = table.children.get(status.case_id)
        return status.model_copy(update={"children": tuple(found)}) if found else status
    try:
        rows = store.read_cases(Listing(limit=CHILDREN_SHOWN, parent=status.case_id))
    except StoreError as exc:  # the store is away: the status of a case in memory still answers, with what was read
        _log.warning("cannot list a case's children; its status shows those read before", case_id=status.case_id,
                     error=str(exc))
        found = table.children.get(status.case_id)
        return status.model_copy(update={"children": tuple(found)}) if found else status
    if not rows:
        return status
    children = tuple(row.case_id for row in reversed(rows))
    table.children[status.case_id] = list(children)  # (kept for a status read after the Substrate closed)
    return status.model_copy(update={"children": children})


_STARTS: dict[str, bool] = {}  # fingerprint -> whether that program has a start_case (a program never changes)


def starts_children(program: Program) -> bool:
    """Whether a program has a `start_case` step (one that has none never has children to list); read once per
    version, since `status()` asks on every call."""
    found = _STARTS.get(program.fingerprint)
    if found is None:
        found = _STARTS[program.fingerprint] = any(
            isinstance(c, EffectSpec) and isinstance(c.fn, Outbound) and isinstance(c.fn.term, StartCase)
            for c in program.consts
        )
    return found


def _may_start_children(workflows: Workflows, status: CaseStatus) -> bool:
    """False only when the case's version is known here and has no `start_case` (a case of an unknown version, or
    of a term started without a name, is read: the store decides)."""
    found = workflows.by_fingerprint.get(status.version) if status.version is not None else None
    return found is None or starts_children(found[1])


async def stored_children(store: Store, status: CaseStatus) -> CaseStatus:
    """`status` with the ids of the cases that case started as its store lists them (a Client's `status()`)."""
    rows = await store.cases(Listing(limit=CHILDREN_SHOWN, parent=status.case_id))
    if not rows:
        return status
    return status.model_copy(update={"children": tuple(row.case_id for row in reversed(rows))})


async def _persist(actor: CaseActor, path: str, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
    """`call()`, tried again after a StoreError (a store outage must not fail the step); a Substrate closing
    meanwhile leaves the step in flight: it waits here to be cancelled with its case's task group. A refusal the
    store would repeat however often it is asked (`refused_for_good`: data it cannot hold) fails the step at
    `path` instead, with the store's reason."""
    delay = 0.05
    clock = actor.shared.clock
    while True:
        try:
            return await call()
        except SubstrateClosed:
            await anyio.sleep_forever()
        except StoreError as exc:  # (a StoreConflict too: the case moved to another node; sent again, it goes there)
            if refused_for_good(exc):
                raise store_refused(exc, actor.case_id, path, what) from exc
            _log.warning("store trouble; trying again", case_id=actor.case_id, action=what, error=str(exc),
                         delay=delay)
            await clock.sleep(delay)
            delay = min(delay * 2, _BACKOFF_CAP)


def _label(t: StartCase | SignalCase) -> str:
    return f"start_case({t.workflow!r})" if isinstance(t, StartCase) else f"signal_case({t.name!r})"


def _child_id(parent: str, req: EffectRequest, t: StartCase, ctx: Mapping[str, Any], label: str) -> str:
    """The id of the child a `start_case` step starts: its `case_id(ctx)`, or the parent's id and the node path;
    checked as every start's id is (ValueError naming the step and the fix)."""
    if t.case_id is not None:
        child_id = t.case_id(ctx)
        if not isinstance(child_id, str) or not child_id:
            raise outbound_value(label, req.path, "case_id(ctx) must return a non-empty str", child_id,
                                 "return the id the child case should have", parent)
        fix = "make case_id(ctx) return an id a case may have (not retried: the same data gives the same id)"
    else:
        child_id = default_child_id(parent, req.path, ctx)
        long = len(child_id.encode("utf-8", "surrogatepass")) > inputs.MAX_CASE_ID_BYTES
        fix = ("give the step case_id=fn returning a " + ("shorter id" if long else "visible id (a name in the node "
               "path, a signal's of a defer or a node's of a net, holds what no case id may)") + " (the default is "
               "the parent's id and the node path; not retried: the same data gives the same id)")
    inputs.check_case_id(child_id, f"{label} at {req.path} of case {inputs.shown(parent)}: the child's case id",
                         fix=fix)
    return child_id


async def _start_case(actor: CaseActor, req: EffectRequest, t: StartCase, ctx: Mapping[str, Any]) -> Any:
    sub = actor.shared.steering
    parent = actor.case_id
    label = _label(t)
    child_id = _child_id(parent, req, t, ctx, label)
    cancels = t.wait is True and t.on_parent_cancel == "cancel"
    data = t.data(ctx) if t.data is not None else None
    if data is not None and not isinstance(data, Mapping):
        raise outbound_value(label, req.path, "data(ctx) must return a mapping (the child's start data) or None",
                             data, "return a dict", parent)

    async def start() -> None:
        # A child an earlier attempt started is found first (not started again: a start repeated while the child
        # is being brought back into memory would race with the inputs that bring it back).
        found, other = await _existing(sub, child_id)
        if found:
            if other != parent:
                raise not_our_child(child_id, parent, req.path, other)
            return
        # Shielded: a withdrawal while the start is being written waits for it, so the child it may cancel exists.
        with anyio.CancelScope(shield=True):
            try:
                await sub.start(StartRequest(
                    t.workflow, data, case_id=child_id, parent=parent, queue=t.queue, priority=t.priority or 0,
                    dedup=t.dedup, waited=t.wait is True,
                    parent_step={"effect_id": req.effect_id, "path": req.path} if cancels else None,
                ))
            except CaseExists as exc:
                found, other = await _existing(sub, child_id)
                if not found and exc.differs is not None:  # a live case of its queue holds its dedup key
                    raise
                if other != parent:
                    raise not_our_child(child_id, parent, req.path, other) from None

    try:
        await _persist(actor, req.path, f"{label}: the start of child {inputs.shown(child_id)}", start)
        if not t.wait:
            return {t.into or "child": child_id}
        result = await _persist(actor, req.path, f"{label}: the wait for child {inputs.shown(child_id)}",
                                lambda: sub.await_case(child_id))
    except CaseFailed as exc:  # a copy: the child's own exception object is handed to its other awaiters too
        failed = CaseFailed(exc.case_id, exc.path, exc.reason)
        failed.record, failed.traceback = exc.record, exc.traceback
        raise failed from exc.__cause__
    except CaseCancelled as exc:
        raise CaseCancelled(exc.case_id, exc.reason) from None
    except anyio.get_cancelled_exc_class():
        if cancels and _withdrawn(actor, req, sub):
            await _cancel_child(actor, req, sub, child_id)
        raise
    return result if t.into is None else {t.into: result}


def check_child_queues(workflows: Workflows, queues: Mapping[str, object]) -> None:
    """Every `start_case(..., queue=)` of the registered workflows (each version, and the library) names a queue of
    the Substrate's `queues=`: else ValueError naming the workflow, the step's path and the queues there are."""
    roots: list[tuple[str, Term]] = []
    for name, programs in workflows.versions.items():
        roots += [(f"workflows[{name!r}]", p.term) for p in programs]
    roots += [(f"library[{n!r}]", t) for n, t in workflows.library.items() if n not in workflows.versions]
    seen: set[int] = set()
    for where, root in roots:
        stack: list[tuple[str, Any]] = [(root.kind, root)]
        while stack:
            path, term = stack.pop()
            if not isinstance(term, Term) or id(term) in seen:
                continue
            seen.add(id(term))
            if isinstance(term, StartCase) and isinstance(term.queue, str) and term.queue not in queues:
                raise unknown_name("queue", term.queue, queues, fix=(
                    f"start_case({term.workflow!r}) at {where} {path} starts its child on it: add it to "
                    "Substrate(queues={name: Queue()}), or name a queue there"))
            stack += [(child_path(path, selector, child), child) for selector, child in children(term)]


async def _existing(sub: Steering, case_id: str) -> tuple[bool, str | None]:
    """Whether a case `case_id` exists (in memory or in the store), and its parent. The store is read without
    blocking the event loop (`status()` reads on the calling thread, waiting up to the store's sync timeout while
    it is out, and a start is retried through an outage: every case here would stall with it)."""
    table = sub.table
    actor = table.cases.get(case_id)
    if actor is not None:
        return True, actor.parent
    if table.store is not None:
        row = await table.store.row(case_id)
        if row is not None:
            return True, row.parent
    try:  # (a queued case, or one in memory only)
        return True, sub.status(case_id).parent
    except CaseNotFound:
        return False, None


def _withdrawn(actor: CaseActor, req: EffectRequest, sub: Steering) -> bool:
    """Whether the step's effect was cancelled because its case withdrew it (not because the case left memory or
    the Substrate is closing)."""
    return (
        req.effect_id not in actor.requested and not actor.closed and actor.stale is None and not actor.evicting
        and sub.table.phase == "open"
    )


def cancel_request_id(parent: str, effect_id: int, path: str) -> str:
    """The request id of the cancel a parent's withdrawn step (effect `effect_id` at `path`) sends its child: the
    same wherever it is sent from (the step itself, or a Substrate that finds the cancel was lost), so a child
    gets it once (a second cancel while it compensates would end it at once)."""
    return inputs.derived_request_id(f"{parent}:{effect_id}:{path}:cancel")


async def _cancel_child(actor: CaseActor, req: EffectRequest, sub: Steering, child_id: str) -> None:
    await cancel_child(sub, actor.case_id, child_id, f"its parent {actor.case_id!r} was cancelled",
                       cancel_request_id(actor.case_id, req.effect_id, req.path), wait=CANCEL_WAIT)


CANCEL_WAIT = 10.0
"""Seconds a withdrawn step waits for its child's cancel to be delivered (the withdrawal waits with it, shielded);
after that a task beside the cases goes on sending it."""


async def cancel_child(
    sub: Steering, parent: str, child_id: str, reason: str, request_id: str, *, wait: float | None = None
) -> None:
    """Send a child its parent's cancel (with compensation) until it is delivered or the child has ended: tried here
    for up to `wait` seconds (shielded: a withdrawal in progress waits for it; None: once), then, while the store
    still fails, by a task beside the cases that keeps trying with a capped backoff as long as the Substrate is
    open. So a store blip never leaves a cancelled parent's child running until the next open or takeover (which
    looks for lost cancels and sends them). The request id makes every attempt, from here or from such a look,
    apply once."""
    if wait is None:
        delivered = await _send_cancel(sub, parent, child_id, reason, request_id, once=True)
    else:
        delivered = False
        with anyio.move_on_after(wait, shield=True):
            delivered = await _send_cancel(sub, parent, child_id, reason, request_id)
    if delivered:
        return
    shared = sub.table.shared
    if shared is None or sub.table.phase != "open":
        return  # (closing: the next open looks for lost cancels)
    _log.warning("a child's cancel is not delivered yet (the store fails); trying again beside the cases",
                 case_id=parent, child=child_id)

    async def keep_sending() -> None:
        await _send_cancel(sub, parent, child_id, reason, request_id)

    shared.start_soon(keep_sending)


async def _send_cancel(
    sub: Steering, parent: str, child_id: str, reason: str, request_id: str, *, once: bool = False
) -> bool:
    """A cancel (with compensation) of a child until it is delivered or needs no delivery (the child has ended or
    is gone, or the Substrate closed: a later open looks for lost cancels): True then. A store failure is tried
    again after a backoff (real time, as a store recovers), unless `once`: False then."""
    delay = 0.05
    while True:
        try:
            await sub.cancel(child_id, reason, request_id)
            return True
        except StoreError as exc:  # (a StoreConflict too: the child moved to another node; sent again, it goes there)
            _log.warning("could not cancel a child; trying again", case_id=parent, child=child_id, error=str(exc),
                         delay=None if once else delay)
        except WfsubError as exc:  # ended already, gone, or the Substrate closed: nothing more to send
            _log.info("child not cancelled", case_id=parent, child=child_id, error=str(exc))
            return True
        if once:
            return False
        await anyio.sleep(delay)
        delay = min(delay * 2, _BACKOFF_CAP)


PAGE = 1000  # rows read at a time by the look for lost cancels


class LostChildren:
    """Runs `cancel_lost_children` in the background when asked (a Substrate opening its store, a takeover): one
    look at a time, and one more after it when asked again meanwhile."""

    def __init__(
        self, sub: Steering, store: Store, spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object]
    ) -> None:
        self.sub = sub
        self.store = store
        self.spawn = spawn
        self.running = False
        self.again = False

    def look(self) -> None:
        if self.running:
            self.again = True
            return
        self.running = True
        self.spawn(self._run)

    async def _run(self) -> None:
        try:
            while True:
                self.again = False
                await cancel_lost_children(self.sub, self.store)
                if not self.again:
                    return
        finally:
            self.running = False


async def cancel_lost_children(sub: Steering, store: Store) -> None:
    """Send the cancels a process died before sending: to the live children a parent waited for with
    `on_parent_cancel="cancel"` whose parent has ended, or lives on without the step that waited for them (see
    the module). Each cancel's request id makes it apply once, however many nodes send it."""
    try:
        queued = await _queued_children(sub, store)
    except StoreError as exc:  # looked for again when the Substrate next opens or takes cases over
        _log.error("could not look for the queued children of ended cases", error=str(exc))
        queued = []
    # The children of live parents first: a parent that ends meanwhile (one recovered mid-cancel ends as its
    # compensation completes) is then still found by the look for the children of ended parents, which follows.
    await cancel_children_of_withdrawn(sub, store, [(c, p, step) for c, p, ended, step in queued
                                                    if not ended and step is not None])
    await cancel_children_of_ended(sub, store, [(c, p, step) for c, p, ended, step in queued if ended])


async def cancel_children_of_ended(
    sub: Steering, store: Store, queued: list[tuple[str, str, dict[str, Any] | None]] | None = None
) -> None:
    """Cancel (with compensation) the live children whose parent has ended although it waited for them with
    `on_parent_cancel="cancel"` (`cancel_with_parent` in their `start` record): the parent's own cancel of the
    child was lost with the process that ended the parent. `queued`: (child, parent, step) of such children still
    in their queue."""
    try:
        found: list[tuple[str, str, bool | None, dict[str, Any] | None]] = [
            (c, p, None, None) for c, p in await store.children_of_ended()]
    except StoreError as exc:  # looked for again when the Substrate next opens
        _log.error("could not look for the children of ended cases", error=str(exc))
        found = []
    found += [(c, p, True, step) for c, p, step in queued or ()]
    for child_id, parent, flagged, step in found:
        try:
            if flagged is None:
                flagged, step = await _waited_for(store, child_id)
            if not flagged:
                continue  # not waited for (wait=False), or abandoned with its parent (on_parent_cancel="abandon")
            row = await store.row(parent)
            ended = "was cancelled" if row is None or row.state == "cancelled" else f"ended {row.state}"
            _log.warning("cancelling a child whose parent ended before cancelling it", case_id=child_id,
                         parent=parent)
            # The step's own request id when the child names it: a cancel the step sent before the process died
            # is then not applied twice (a second cancel would cut the child's compensation short).
            request_id = inputs.derived_request_id(f"{parent}:ended:cancel:{child_id}") if step is None else \
                cancel_request_id(parent, step["effect_id"], step["path"])
            await cancel_child(sub, parent, child_id, f"its parent {parent!r} {ended}", request_id)
        except WfsubError as exc:  # (ended meanwhile, or the store is out: the next open looks again)
            _log.info("child not cancelled", case_id=parent, child=child_id, error=str(exc))


async def _waited_for(store: Store, child_id: str) -> tuple[bool, dict[str, Any] | None]:
    """(whether the parent of a stored child waits for it with "cancel", the parent's step when known): its row
    names the step; a child started before rows named it says so in its `start` record only."""
    row = await store.row(child_id)
    if row is not None and row.parent_step:
        return True, row.parent_step
    journal = await store.journal(child_id)
    start = start_of(journal[0]) if journal else {}
    return bool(start.get("cancel_with_parent")), parent_step_of(start)


async def cancel_children_of_withdrawn(
    sub: Steering, store: Store, queued: list[tuple[str, str, dict[str, Any]]] | None = None
) -> None:
    """Cancel (with compensation) the live children a live parent of this Substrate's waited for with
    `on_parent_cancel="cancel"` at a step it has withdrawn since (its region was cancelled, a timeout or another
    branch withdrew it): the step sends that cancel when it is withdrawn, and a process that died before it did
    lost it. The parent is brought into memory if it is not there (its replay says which steps are in flight).
    `queued`: (child, parent, step) of such children still in their queue (their parent this node's)."""
    owner = sub.table.owner if store.shared else None
    found: list[tuple[str, str, dict[str, Any]]] = []
    after = 0
    try:
        while True:
            page = await store.children_waited_for(owner, after, PAGE)
            found += [(child, parent, step) for _, child, parent, step in page]
            if len(page) < PAGE:
                break
            after = page[-1][0]
    except StoreError as exc:  # looked for again when the Substrate next opens or takes cases over
        _log.error("could not look for the children of withdrawn steps", error=str(exc))
    found += queued or ()
    for child_id, parent, step in found:
        try:
            await _cancel_if_withdrawn(sub, child_id, parent, step)
        except WfsubError as exc:  # (ended meanwhile, suspended, or the store is out: the next look tries again)
            _log.info("child not cancelled", case_id=parent, child=child_id, error=str(exc))


async def _cancel_if_withdrawn(sub: Steering, child_id: str, parent: str, step: Mapping[str, Any]) -> None:
    effect_id, path = step.get("effect_id"), step.get("path")
    if not isinstance(effect_id, int) or not isinstance(path, str):
        return  # (not a step this runtime wrote)
    try:
        actor = await sub.live(parent, "look at the steps of a parent case")
    except Remote:
        return  # another node's now: it looks when it takes the case over
    ended = actor.state in FINAL
    if actor.journal is None or (not ended and _in_flight(actor, effect_id)):
        return
    # A parent that ended since it was listed (its step withdrawn with it) has its child cancelled here too.
    _log.warning("cancelling a child whose parent withdrew the step waiting for it before cancelling it",
                 case_id=child_id, parent=parent, path=path)
    if not ended:
        why = f"withdrew the step waiting for it ({path})"
    else:  # (the words of the parent's own cancel, which may reach it first with the same request id)
        why = "was cancelled" if actor.state == CaseState.CANCELLED else f"ended {actor.state.value}"
    await cancel_child(sub, parent, child_id, f"its parent {parent!r} {why}",
                       cancel_request_id(parent, effect_id, path))


async def started_from_queue(sub: Steering, child_id: str, parent: str, step: Mapping[str, Any]) -> None:
    """A child waited for with "cancel" has just started from its queue: cancel it if its parent (one of this
    Substrate's) withdrew the step waiting for it meanwhile. A look for lost cancels that ran while the child was
    claimed and not yet started saw it neither in its queue nor among the cases, so the start looks itself."""
    try:
        await _cancel_if_withdrawn(sub, child_id, parent, step)
    except WfsubError as exc:  # (the parent ended, or the store is out: the next look tries again)
        _log.info("child not cancelled", case_id=parent, child=child_id, error=str(exc))


def _in_flight(actor: CaseActor, effect_id: int) -> bool:
    """Whether the case has effect `effect_id` in flight: started, or waiting to be started again (recovered)."""
    if effect_id in actor.requested:
        return True
    return actor.resume is not None and any(req.effect_id == effect_id for req in actor.resume[0])


async def _queued_children(sub: Steering, store: Store) -> list[tuple[str, str, bool, dict[str, Any] | None]]:
    """(child id, parent id, whether the parent ended, its step) of the queued children (`start_case(...,
    queue=)`) waited for with "cancel" whose parent has ended, or lives on as this Substrate's."""
    found: list[tuple[str, str, bool, dict[str, Any] | None]] = []
    before: int | None = None
    while True:
        items = store.read_queue_items(state="queued", limit=PAGE, before=before)
        for item in items:
            parent = item.start.get("parent")
            if isinstance(parent, str) and item.start.get("cancel_with_parent"):
                row = await store.row(parent)
                if row is None:
                    continue
                if row.ended_at is not None:
                    found.append((item.case_id, parent, True, parent_step_of(item.start)))
                elif not store.shared or row.owner == sub.table.owner:
                    found.append((item.case_id, parent, False, parent_step_of(item.start)))
        if len(items) < PAGE:
            return found
        before = items[-1].order


async def _signal_case(actor: CaseActor, req: EffectRequest, t: SignalCase, ctx: Mapping[str, Any]) -> Any:
    sub = actor.shared.steering
    label = _label(t)
    target = t.case_id(ctx)
    if not isinstance(target, str) or not target:
        raise outbound_value(label, req.path, "case_id(ctx) must return a non-empty str", target,
                             "return the id of the case to signal", actor.case_id)
    inputs.check_case_id(target, f"{label} at {req.path} of case {inputs.shown(actor.case_id)}: the case id to "
                         "signal", new=False, fix="return the id of the case to signal")
    payload = t.payload(ctx) if t.payload is not None else None
    request_id = inputs.derived_request_id(f"{actor.case_id}:{req.effect_id}:{req.path}")
    await _persist(actor, req.path, f"{label} to case {inputs.shown(target)}",
                   lambda: sub.signal(target, t.name, payload, request_id))
    return None

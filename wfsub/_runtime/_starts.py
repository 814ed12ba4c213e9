"""Starting cases: the API door's checks, and the one route every start takes (`Starts.start`, over a
`StartRequest`): a repeated id is the same start or CaseExists; a queued start waits in its queue; a standby's goes
to the owner through the store; otherwise the case's actor is made, its `start` record written (with a store), and
it is scheduled.

`new_case` returns once the case is registered and its actor scheduled (with a store: once its `start` record is
durable); it does not wait for the actor's first burst. Everything that can fail at start (validation,
compilation, bad or non-JSON data) fails inside `new_case`, before anything is scheduled or written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import BaseModel

from .._errors import CaseExists, WorkflowNotRegistered
from .._program import Program
from .._store import RETRIED, QueueItem
from .._terms import Term
from .._vm import Machine, Scheduler, Seeded
from . import _inputs as inputs
from ._case import CaseActor
from ._children import started_from_queue
from ._control import Existing
from ._handle import CaseHandle
from ._journal import as_journaled, parent_step_of, queued_start
from ._options import positive
from ._queues import Queue, check_queued
from ._registry import Workflows
from ._same_start import same_durable, start_differs
from ._schedules import Schedule
from ._start_request import StartRequest

if TYPE_CHECKING:
    from ._deliver import Deliver
    from ._table import CaseTable

PROGRAM_CACHE_SIZE = 1024


class Starts:
    """The starts of one Substrate's cases (see the module)."""

    def __init__(self, table: CaseTable, deliver: Deliver) -> None:
        self.t = table
        self.deliver = deliver
        self.programs: dict[Term, Program] = {}  # compiled terms, by term (at most PROGRAM_CACHE_SIZE)
        self.case_level = table.opts.case_level  # (the sinks are given once: a new case's level never changes)

    async def new_case(
        self, workflow: str | Term, data: Mapping[str, Any] | BaseModel | None, *, case_id: str | None,
        timeout: float | None, scheduler: str | Scheduler, placement: str, tags: Mapping[str, str] | None,  # noqa: ASYNC109
        queue: str | None, priority: int, dedup: str | None, partition: str | None, delay: float | None,
    ) -> CaseHandle:
        """The API's door: its arguments checked, then `start`."""
        t = self.t
        t.check_open("start a case")
        if case_id is not None:
            case_id = inputs.check_case_id(case_id)
        case_tags = inputs.tags(tags, case_id)
        check_queued(t.queues.queues, queue, priority, dedup, partition, delay)
        if placement not in ("here", "any"):
            raise ValueError(f"placement must be 'here' (this Substrate runs the case) or 'any', got {placement!r}")
        if placement == "any" and (t.store is None or not t.store.shared):
            raise ValueError(
                "placement='any' queues a case for any node of a shared store (store='postgresql://...'); this "
                "Substrate has no shared store: start the case here (the default placement)"
            )
        if timeout is not None:
            positive(timeout, "timeout", allow_none=True)
        seed = None if scheduler == "deterministic" else seed_of(scheduler)
        return await self.start(StartRequest(
            workflow, data, case_id=case_id, timeout=timeout, seed=seed, placement=placement, tags=case_tags or None,
            queue=queue, priority=priority, dedup=dedup, partition=partition, delay=delay,
        ))

    async def start(self, req: StartRequest) -> CaseHandle:
        """Start the case `req` asks for (its door checked it): its handle (see the module)."""
        t = self.t
        t.check_open("start a case")
        program, name = self.program(req.workflow)
        model = t.workflows.input_of(program)
        data = req.data
        start_data = inputs.start_data(data, model, name, req.case_id) if data is not None or model else None
        durable = t.store is not None
        sent = self._as_sent(data, model, req.sent) if durable else None
        try:
            case_id = t.new_id(req.case_id)
        except CaseExists:
            assert isinstance(req.case_id, str)
            case_id = req.case_id
            if not durable:
                return self._same_in_memory(case_id, program, name, start_data, model)
            if not await t.deleted_elsewhere(case_id):
                return await self.same_start(case_id, name, start_data, sent, model)
        if durable:
            start_data, _ = as_journaled(start_data or {}, "data", t.opts.max_payload)
        elif req.queue is None and t.queues.queues and not req.from_queue:
            known = t.queues.item(case_id)  # (one claimed is on its way: its case is not in memory yet)
            if known is not None and known.state in ("queued", "started", "cancelled"):
                return self._same_queued(known, name, {"data": start_data}, model)
        now = t.clock.now()
        if req.queue is not None:
            return await self._enqueue(req, case_id, name, start_data, sent, model, now)
        deadline = None if req.timeout is None else now + req.timeout
        if t.outside is not None:  # a standby: the owner runs it
            assert name is not None
            await t.outside.start(name, program.fingerprint, start_data, case_id, deadline, req.seed,
                                  tags=req.tags, sent=sent, model=model)
            return CaseHandle(self.deliver, None, case_id)
        level = self.case_level
        machine = Machine(
            program, start_data, scheduler=None if req.seed is None else Seeded(req.seed), trace_level=level,
            case_id=case_id, max_instances=t.opts.max_instances, workflow=name,
        )
        actor = self.actor(case_id, machine, now, deadline, name, level)
        actor.tags = dict(req.tags) if req.tags else None
        actor.parent = req.parent
        if not durable:  # what a start repeated with its id is compared with (a durable case: its start record)
            actor.start = {"workflow": _workflow_of(program, name), "data": dict(start_data or {})}
            self.spawn(actor)
            self._memory_child(req, actor)
            return CaseHandle(self.deliver, actor)
        return await self._written(req, actor, program, name, start_data, sent, model, deadline)

    async def _written(
        self, req: StartRequest, actor: CaseActor, program: Program, name: str | None, start_data: Any,
        sent: dict[str, Any] | None, model: type[BaseModel] | None, deadline: float | None,
    ) -> CaseHandle:
        """A durable case's `start` record written (or the same start found), then the case scheduled here."""
        t = self.t
        loader = t.loader
        assert loader is not None
        assert name is not None
        case_id = actor.case_id
        queued = req.placement == "any"
        if await self._joined(case_id):  # another call of this Substrate wrote this id's start meanwhile
            return await self.same_start(case_id, name, start_data, sent, model)
        written = anyio.Event()
        t.starting[case_id] = ({"workflow": name, "data": start_data or {}, "sent": sent}, written)
        try:
            await loader.start(actor, name, program.fingerprint, start_data, req.seed, deadline, queued=queued,
                               cancel_with_parent=req.cancel_with_parent, sent=sent,
                               parent_step=None if req.parent_step is None else dict(req.parent_step),
                               from_queue=req.from_queue, waited=req.waited, schedule=req.schedule)
        except Existing as same:  # started by an earlier call with the same workflow and data
            return CaseHandle(self.deliver, same.actor, case_id)
        except CaseExists:  # an earlier run's case has this id: the same start, or CaseExists naming what differs
            t.starting.pop(case_id, None)
            written.set()
            return await self.same_start(case_id, name, start_data, sent, model)
        finally:
            if t.starting.get(case_id, (None, None))[1] is written:
                del t.starting[case_id]
            written.set()
        if queued:
            return CaseHandle(self.deliver, None, case_id)
        self.spawn(actor)
        return CaseHandle(self.deliver, actor)

    def _memory_child(self, req: StartRequest, actor: CaseActor) -> None:
        """A child case without a store: listed under its parent (a durable child is found through the store's
        parent index), and marked when its parent waits for it (`delete` of the parent reads it)."""
        if req.parent is None:
            return
        self.t.children.setdefault(req.parent, []).append(actor.case_id)
        if req.waited:
            actor.waited = "cancel" if req.parent_step is not None else "abandon"

    async def _joined(self, case_id: str) -> bool:
        """Wait for the calls of this Substrate that are writing a start with this case id (a queued start is not in
        memory, so two of them could both be in flight): True once one of them wrote it, False if none did."""
        assert self.t.store is not None
        waited = False
        while (first := self.t.starting.get(case_id)) is not None:
            await first[1].wait()
            waited = True
        return waited and await self.t.store.row(case_id) is not None

    def _as_sent(
        self, data: object, model: type[BaseModel] | None, queued: Mapping[str, Any] | None
    ) -> dict[str, Any] | None:
        """The start data as its caller sent it, as JSON, where the input `model` makes the case start with other
        data (its dump): kept in the start record so that a retry with the same data is the same start, whichever
        door takes it. None where there is no model, or the data sent is not JSON (a retry compares dumps)."""
        if queued is not None:  # dequeued: the data sent to the queue (its `data` is the model's dump already)
            return dict(queued)
        if model is None:
            return None
        sent = data.model_dump(mode="json") if isinstance(data, BaseModel) else {} if data is None else data
        try:
            journaled, _ = as_journaled(sent, "data", self.t.opts.max_payload)
        except (TypeError, ValueError):
            return None
        return journaled if isinstance(journaled, dict) else None

    # -- the same start again ----------------------------------------------------------------------------------

    async def same_start(
        self, case_id: str, name: str | None, data: Mapping[str, Any] | None, sent: Mapping[str, Any] | None,
        model: type[BaseModel] | None,
    ) -> CaseHandle:
        """A start repeated with the id of an existing durable case: its handle if it is the same start (nothing is
        written), else CaseExists naming what differs (see `_same_start`)."""
        t = self.t
        assert t.store is not None
        await same_durable(t.store, t.starting, case_id, name, data, sent, model, t.opts.max_payload)
        return CaseHandle(self.deliver, t.cases.get(case_id), case_id)

    def _same_in_memory(
        self, case_id: str, program: Program, name: str | None, data: Mapping[str, Any] | None,
        model: type[BaseModel] | None,
    ) -> CaseHandle:
        """Without a store: a start repeated with the id of a case in memory is that case if it is the same start
        (the durable stores' rule, `_same_start`), else CaseExists naming what differs."""
        actor = self.t.cases[case_id]
        if actor.start is None:  # (a case brought back from a store: never here without one)
            raise CaseExists(case_id)
        start_differs(case_id, actor.start, _workflow_of(program, name), {"data": dict(data or {})}, model)
        return CaseHandle(self.deliver, actor)

    def _same_queued(
        self, known: QueueItem, workflow: str | None, asked: Mapping[str, Any], model: type[BaseModel] | None
    ) -> CaseHandle:
        """A start repeated with the id of a case started on a queue (`asked`: as a start record has it): its
        handle if it is the same start, else CaseExists naming what differs."""
        start_differs(known.case_id, known.start, workflow, asked, model)
        return CaseHandle(self.deliver, self.t.cases.get(known.case_id), known.case_id)

    # -- queues ------------------------------------------------------------------------------------------------

    async def _enqueue(
        self, req: StartRequest, case_id: str, name: str | None, start_data: Any, sent: dict[str, Any] | None,
        model: type[BaseModel] | None, now: float,
    ) -> CaseHandle:
        """A queued start: its item put in its queue (the case starts when the queue has room)."""
        t = self.t
        wait_for = check_queued(t.queues.queues, req.queue, req.priority, req.dedup, req.partition, req.delay)
        if name is None:
            assert not isinstance(req.workflow, str)
            t.queued_terms[case_id] = req.workflow
        item = QueueItem(
            case_id, req.queue or "", req.partition, req.priority, req.dedup,
            queued_start(name, start_data, req.timeout, req.seed, req.tags, req.parent, req.cancel_with_parent, sent,
                         req.parent_step, req.waited),
            now + wait_for, now,
        )
        try:
            await t.queues.put(item, req.schedule)
        except CaseExists as exc:
            t.queued_terms.pop(item.case_id, None)
            if exc.differs is not None:  # a dedup key held by a live case of the queue
                raise
            known = t.queues.item(item.case_id)
            if known is not None:  # the same start again (a schedule's slot on two nodes): that case
                return self._same_queued(known, item.start["workflow"], item.start, model)
            if t.store is None:
                raise
            return await self.same_start(item.case_id, item.start["workflow"], item.start["data"],
                                         item.start.get("sent"), model)
        return CaseHandle(self.deliver, None, item.case_id)

    async def dequeued(self, item: QueueItem) -> None:
        """Start a case its queue has room for now (its start was checked when it was queued)."""
        start = item.start
        if start.get(RETRIED) is not None:  # a retried case back from its queue: it goes on from its retry record
            assert self.t.loader is not None  # (a case is retried on a store only)
            await self.t.loader.load(item.case_id)
            return
        workflow: str | Term = start["workflow"] if start["workflow"] is not None else self.t.queued_terms.pop(
            item.case_id)
        step, parent = parent_step_of(start), start.get("parent")
        await self.start(StartRequest(
            workflow, start.get("data"), case_id=item.case_id, timeout=start.get("timeout"), seed=start.get("seed"),
            tags=start.get("tags") or None, parent=parent, cancel_with_parent=bool(start.get("cancel_with_parent")),
            parent_step=step, waited=bool(start.get("waited")), sent=start.get("sent"), from_queue=True,
        ))
        if step is not None and isinstance(parent, str):
            shared = self.t.shared
            assert shared is not None
            await started_from_queue(shared.steering, item.case_id, parent, step)

    # -- schedules ---------------------------------------------------------------------------------------------

    async def scheduled(self, schedule: Schedule, slot: float, case_id: str, *, paused_refuses: bool = False
                        ) -> CaseHandle:
        """The case of a schedule's slot (`paused_refuses`: refused, SchedulePaused, if the schedule is paused when
        it is written; a trigger or a backfill starts it paused or not)."""
        return await self.start(StartRequest(
            schedule.workflow, schedule.data_for(slot), case_id=case_id, queue=schedule.queue,
            schedule=schedule.name if paused_refuses else None,
        ))

    async def slot(self, schedule: Schedule, slot: float, case_id: str) -> CaseHandle:
        """The case of a schedule's slot as its loop starts it."""
        return await self.scheduled(schedule, slot, case_id, paused_refuses=True)

    async def backfilled(self, schedule: Schedule, slot: float) -> CaseHandle:
        case_id = schedule.case_id(slot)
        actor = self.t.cases.get(case_id) if self.t.store is None else None
        if actor is not None:  # (without a store the slot's case in memory is that case: its data is the slot's)
            return CaseHandle(self.deliver, actor)
        return await self.scheduled(schedule, slot, case_id)

    # -- actors ------------------------------------------------------------------------------------------------

    def actor(
        self, case_id: str, machine: Machine, now: float, deadline: float | None, name: str | None,
        level: str | None = None,
    ) -> CaseActor:
        shared = self.t.shared
        assert shared is not None
        level = self.case_level if level is None else level
        return CaseActor(case_id, machine, shared, now, level=level, deadline=deadline, workflow=name)

    def spawn(self, actor: CaseActor) -> None:
        t = self.t
        shared = t.shared
        assert shared is not None
        if actor.journal is None:
            actor.order = next(t.orders)
        t.cases[actor.case_id] = actor
        t.counts["started"] += 1
        t.counts["live"] += 1
        shared.busy += 1
        shared.start_soon(actor.run)

    def program(self, workflow: str | Term) -> tuple[Program, str | None]:
        """The program a case starts on, and the registered name it starts from (None: a term not registered)."""
        workflows = self.t.workflows
        if isinstance(workflow, str):
            return workflows.newest(workflow), workflow
        if not isinstance(workflow, Term):
            raise TypeError(
                f"new_case takes a registered workflow name or a workflow term built with wfsub's constructors "
                f"(seq, par, task, ...), got {type(workflow).__name__}"
            )
        programs = self.programs
        program = programs.get(workflow)
        if program is None:
            program = workflows.compile(workflow)  # raises InvalidWorkflow
            if len(programs) >= PROGRAM_CACHE_SIZE:
                del programs[next(iter(programs))]
            programs[workflow] = program
        name = workflows.name_of(program)
        if self.t.store is not None and name is None:
            raise WorkflowNotRegistered(repr(workflow)[:80], workflows.names)
        return program, name


def seed_of(scheduler: object) -> int | None:
    """The seed a scheduler records (None: the deterministic one); TypeError for anything else."""
    if scheduler == "deterministic":
        return None
    if isinstance(scheduler, Seeded):
        return scheduler.seed
    raise TypeError(
        f"scheduler must be 'deterministic' or Seeded(seed) (from wfsub.lowlevel), got {scheduler!r}"
    )


def check_schedules(schedules: Sequence[Schedule], workflows: Workflows, queues: Mapping[str, Queue]) -> list[Schedule]:
    """`Substrate(schedules=)`, checked: each a Schedule with its own name, of a registered workflow and queue."""
    if isinstance(schedules, Schedule) or not isinstance(schedules, Sequence):
        raise TypeError("schedules must be a sequence of wfsub.Schedule, e.g. schedules=[Schedule(...)]")
    seen: set[str] = set()
    for s in schedules:
        if not isinstance(s, Schedule):
            raise TypeError(f"schedules lists {s!r}, which is not a wfsub.Schedule")
        if s.name in seen:
            raise ValueError(f"schedules lists two schedules named {s.name!r}: give each its own name")
        seen.add(s.name)
        workflows.newest(s.workflow)  # WorkflowNotRegistered, naming the registered ones
        if s.queue is not None:
            check_queued(queues, s.queue, 0, None, None, None)
    return list(schedules)


def _workflow_of(program: Program, name: str | None) -> str:
    """The workflow a case without a store started from, as a repeated start compares it: its registered name, or
    for a term not registered the program's fingerprint (the same term again, or an equal one, is the same)."""
    return name if name is not None else f"unregistered {program.term.kind} {program.fingerprint[:12]}"

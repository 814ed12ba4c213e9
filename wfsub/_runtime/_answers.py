"""Update answers and the callers waiting for them: an update is a signal whose sender waits for the answer.

`sub.update(case_id, name, payload)` sends the update as a signal marked as one (`_inputs.update`): its request
id (the caller's, or one made for it) is the update's id. The case's vm answers it (see `_vm._updates`): an
answer, a refusal by a `check=`, a failed reply function, or the case's end. Each answer is kept by the case
actor under the update's id (`Updates`, the latest `ANSWERS_KEPT`), and waiters on that id are woken; every
call with the same id gets the same answer, also two at once and a call repeated after the first returned.

Answers are not journaled: replay computes them again. A durable case also keeps its latest answers on its case
row (`CaseRow.answers`, written with the row: when the case parks or ends, when it has waited a moment on its
effects, and with its next commit after an answer while it runs on), which is where they are found:

- by a standby or a `wfsub.Client`, which writes the update to the inbox and then reads the row until the
  answer is there (or the case ended, or the owner refused the inbox row). A call retried with the id of an
  update the case journaled reads the row the same way; the row also lists the updates the case journaled and
  has not answered yet (`CaseRow.owed`), so a row written after that update's record (its `last_seq` at or past
  the record's seq) that has the id in neither list says the answer was given and dropped, and the call raises
  what the owner's does (`answer_gone`). A row written before the list was kept has none: such a call reads the
  row until the answer comes (or its timeout);
- by a case brought back into memory (restart, takeover, eviction): the row's answers, then those its replay
  recomputes (the updates journaled after the row was written), so a call retried with its request id after a
  crash gets its answer;
- by a caller of this process whose case left it for another owner (shared stores: another node took the case
  over, so this node's actor was fenced) while the caller waited: the update it sent was journaled before (the
  new owner's replay answers it), or refused unrecorded by the fenced actor and sent through the inbox, so the
  caller reads its answer from the row as a Client would (`moved`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from .._errors import CaseCancelled, CaseFailed, CaseNotFound, SignalRejected, StepFailed, answer_gone, owner_refused
from .._trace import get_logger
from ._status import RefusedInput

if TYPE_CHECKING:
    from .._store import CaseRow, Store
    from ._case import CaseActor

_log = get_logger("wfsub.runtime")

ANSWERS_KEPT = 100
"""Answers a case keeps (in memory and on its row), newest last: a retried call finds its answer among them."""

REFUSED_KEPT = 10
"""Inputs refused by a `check=` when a wait took them from the buffer, kept newest first for `status().refused`."""

ENDED = "ended"
ENDED_STATES = ("done", "failed", "cancelled")  # a case row's states once its case has ended
MOVED = "moved"  # not an answer: the case left this process, its answer is to be read from the case row


class Pending:
    """Callers waiting on one update id: they wait on `event`, then read `answer`."""

    __slots__ = ("event", "answer")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.answer: list[Any] | None = None


class Updates:
    """A case actor's updates: callers waiting by update id, the latest answers ([kind, value]) by id, and the ids
    of the updates journaled and not answered yet."""

    __slots__ = ("pending", "answers", "owed", "refused", "unsaved")

    def __init__(self) -> None:
        self.pending: dict[str, Pending] = {}
        self.answers: dict[str, list[Any]] = {}
        self.unsaved = False  # an answer given since the case's row was last written: its next write carries it
        self.owed: set[str] = set()  # from its record's making (before the commit) to its answer: `CaseRow.owed`
        # inputs a check= refused when a wait took them from the buffer: {kind, name, reason, time, request_id}
        self.refused: list[dict[str, Any]] = []

    def keep(self, uid: str, answer: list[Any]) -> None:
        answers = self.answers
        answers.pop(uid, None)
        answers[uid] = answer
        self.unsaved = True
        self.owed.discard(uid)
        if len(answers) > ANSWERS_KEPT:
            del answers[next(iter(answers))]
        waiting = self.pending.pop(uid, None)
        if waiting is not None:
            waiting.answer = answer
            waiting.event.set()

    def waiter(self, uid: str) -> Pending:
        """The waiter for `uid` (shared by every caller with that id); answered at once if the answer is kept."""
        found = self.pending.get(uid)
        if found is None:
            found = Pending()
            kept = self.answers.get(uid)
            if kept is not None:
                found.answer = kept
                found.event.set()
            else:
                self.pending[uid] = found
        return found


def of(actor: CaseActor) -> Updates:
    """The case's updates. Shared by every actor the case has in this process (`Shared.updates`, by case id, while
    the case lives): a caller waiting while the case leaves memory is answered by the actor that brings it back."""
    found = actor.updates
    if found is None:
        table = actor.shared.updates
        found = table.get(actor.case_id)
        if found is None:
            found = table[actor.case_id] = Updates()
        actor.updates = found
    return found


def moved(updates: Updates, uid: str | None = None) -> None:
    """Tell the callers waiting here for update `uid` (None: every update) that the case moved to another owner:
    they read the answer from its row (see the module). Nothing is kept: the answers are the new owner's."""
    for key, waiting in list(updates.pending.items()):
        if uid is None or key == uid:
            del updates.pending[key]
            waiting.answer = [MOVED, None]
            waiting.event.set()


def dispatch(actor: CaseActor, answers: Iterable[tuple[str | None, str, str, Any]]) -> None:
    """The vm's answers after a burst: kept and handed to their callers; refusals logged at WARNING."""
    for uid, kind, name, value in answers:
        if kind == "refused" or kind == "passed":
            what = "update" if uid is not None else "signal"
            if kind == "refused":
                _log.warning("input refused by its wait's check", case_id=actor.case_id, kind=what, name=name,
                             reason=value[0], at=value[1])
            else:
                _log.warning("update refused: no wait for it can be reached any more", case_id=actor.case_id,
                             kind=what, name=name, reason=value[0], at=value[1], request_id=uid)
            found = of(actor)
            found.refused.insert(0, {"kind": what, "name": name, "reason": f"{value[0]} (at {value[1]})",
                                     "time": actor.shared.clock.now(), "request_id": uid})
            del found.refused[REFUSED_KEPT:]
        if uid is not None:
            of(actor).keep(uid, [kind, value])


def at_end(actor: CaseActor) -> None:
    """The case ended: updates still owed are answered by its end (None if done, else its failure or cancel)."""
    found = actor.updates
    if found is None:
        return
    for uid in list(found.pending):
        found.keep(uid, [ENDED, None])
    found.owed.clear()  # (an ended case owes nothing: its row's state answers every update)
    actor.shared.updates.pop(actor.case_id, None)  # (the actor keeps them: a retried call reads them there)


def restore(actor: CaseActor, row: CaseRow, replayed: Iterable[tuple[str | None, str, str, Any]]) -> None:
    """A case brought back: the answers and refusals its row kept, then those its replay computed (a refusal the
    row lists already, made again by the replay, is listed once); owed: what its machine owes once replayed."""
    listed: list[dict[str, Any]] = []
    owed = actor.machine.owed_updates() if actor.machine is not None else []
    if owed or actor.updates is not None or actor.shared.updates.get(actor.case_id) is not None:
        of(actor).owed = set(owed)  # (every journaled update is applied now: the rest are answered)
    if row.answers or row.taken_refused:
        found = of(actor)
        for uid, answer in (row.answers or {}).items():
            if isinstance(answer, list) and len(answer) == 2:
                found.answers[uid] = answer
        listed = [r for r in row.taken_refused or () if isinstance(r, dict)][:REFUSED_KEPT]
    dispatch(actor, replayed)
    if actor.updates is not None and (listed or actor.updates.refused):
        seen = {_same_input(r) for r in listed}
        fresh = [r for r in actor.updates.refused if _same_input(r) not in seen]
        actor.updates.refused = (fresh + listed)[:REFUSED_KEPT]


def _same_input(refused: dict[str, Any]) -> tuple[Any, ...]:
    return refused.get("kind"), refused.get("name"), refused.get("reason"), refused.get("request_id")


def row_answers(actor: CaseActor) -> dict[str, Any] | None:
    """`CaseRow.answers`, for a row about to be written (it carries every answer given so far)."""
    found = actor.updates
    if found is None or not found.answers:
        return None
    found.unsaved = False
    return dict(found.answers)


def unsaved(actor: CaseActor) -> bool:
    """Whether the case answered an update since its row was last written: a caller on a standby or a client reads
    the answer there, so the case's next commit writes its row (a case that runs on after answering, through
    effects that each end before its row would record the wait, would otherwise keep the answer from it)."""
    found = actor.updates
    return found is not None and found.unsaved


def row_owed(actor: CaseActor) -> list[str] | None:
    """`CaseRow.owed` (sorted); None for a case that has neither answered nor journaled an update."""
    found = actor.updates
    if found is None or not (found.answers or found.owed):
        return None
    return sorted(found.owed)


def journaled(actor: CaseActor, uid: str) -> None:
    """The record of update `uid` is made (to be committed): the case owes its answer from now on."""
    of(actor).owed.add(uid)


def not_journaled(actor: CaseActor, uids: Iterable[str]) -> None:
    """Records of updates that were not written after all (a failed commit, or ids the journal held already):
    owed only if the machine owes them (an id it took before)."""
    found = actor.updates
    if found is not None:
        machine = actor.machine
        for uid in uids:
            if machine is None or not machine.owes(uid):
                found.owed.discard(uid)


def row_refused(actor: CaseActor) -> list[dict[str, Any]] | None:
    found = actor.updates
    return list(found.refused) if found is not None and found.refused else None


def with_taken(refused: tuple[RefusedInput, ...], taken: list[dict[str, Any]] | None) -> tuple[RefusedInput, ...]:
    """`status().refused`: the inbox inputs the owner refused and the inputs a check refused when a wait took
    them, newest first, the latest ten."""
    if not taken:
        return refused
    listed = [*refused, *(RefusedInput(**r) for r in taken)]
    listed.sort(key=lambda r: r.time, reverse=True)
    return tuple(listed[:REFUSED_KEPT])


def result(case_id: str, name: str, answer: list[Any], ended: Any) -> Any:
    """The value an `update` call returns for `answer`, or the error it raises. `ended()`: the case's outcome
    (its final data, or raises CaseFailed / CaseCancelled) for an update the case's end answered."""
    kind, value = answer
    if kind == "answer":
        return value
    if kind == "refused":
        raise SignalRejected.check_refused(case_id, "update", name, str(value[0]), str(value[1]))
    if kind == "passed":
        raise SignalRejected.passed(case_id, name, str(value[0]), str(value[1]))
    if kind == "withdrawn":
        raise SignalRejected.withdrawn(case_id, name, str(value[0]), str(value[1]))
    if kind == "error":
        raise StepFailed(str(value[1]), str(value[0]))
    ended()  # raises for a failed or cancelled case
    return None


def row_result(row: CaseRow, name: str, uid: str) -> tuple[bool, Any]:
    """(found, value) for update `uid` from a case row (read by a process that does not own the case); raises
    what the call raises. Not found: the owner has not answered it yet."""
    answer = (row.answers or {}).get(uid)
    if isinstance(answer, list) and len(answer) == 2:
        return True, result(row.case_id, name, answer, lambda: row_outcome(row))
    if row.state in ENDED_STATES:
        row_outcome(row)
        return True, None
    return False, None


def row_outcome(row: CaseRow) -> None:
    """Raise the failure or cancel of an ended case from its row (nothing for a case that is done)."""
    if row.state == "failed":
        error: Mapping[str, Any] = row.error or {}
        raise CaseFailed(row.case_id, str(error.get("path", "?")), str(error.get("message", "")))
    if row.state == "cancelled":
        raise CaseCancelled(row.case_id, row.cancel_reason or "cancelled")


POLL_FIRST = 0.002
POLL_MOST = 0.05


async def remote_answer(store: Store, case_id: str, name: str, uid: str, inbox_id: int) -> Any:
    """The answer to update `uid` of a case another process owns: read from its row once the owner has written
    it (polling, a few ms apart at first); the owner's refusal of the inbox row `inbox_id` is raised. `inbox_id`
    0: the update was journaled before; a row that says its answer was dropped raises `answer_gone`."""
    delay = POLL_FIRST
    applied_at = None if inbox_id else await journaled_at(store, case_id, uid)
    while True:
        row = await store.row(case_id)
        if row is None:
            raise CaseNotFound(case_id)
        if inbox_id and row.state in ENDED_STATES and uid not in (row.answers or {}) \
                and await journaled_at(store, case_id, uid) is None:  # ended before it took this one
            raise SignalRejected.ended(case_id, f"take update {name!r}", row.state)
        found, value = row_result(row, name, uid)
        if found:
            return value
        if applied_at is not None and answer_dropped(row, uid, applied_at):
            raise answer_gone(case_id, name, uid, ANSWERS_KEPT)
        if inbox_id:
            pending = await store.inbox_row(inbox_id)
            if pending is not None and pending.refused:
                raise owner_refused(case_id, f"take update {name!r}", pending.refused)
        await anyio.sleep(delay)
        delay = min(2 * delay, POLL_MOST)


async def journaled_at(store: Store, case_id: str, uid: str) -> int | None:
    """The seq of the record that journaled update `uid` (of the `snapshot` record that replaced it, in a
    compacted journal); None: not journaled."""
    records = await store.journaled_request(case_id, uid)
    seq = records[-1].get("seq") if records else None
    return seq if isinstance(seq, int) else None


def answer_dropped(row: CaseRow, uid: str, applied_at: int) -> bool:
    """Whether a case row says update `uid`, journaled at seq `applied_at`, was answered and its answer dropped:
    the row lists what the case owes (`owed`), was written after that record, and has the id in neither list."""
    owed = row.owed
    return (
        owed is not None and row.last_seq >= applied_at and uid not in (row.answers or {}) and uid not in owed
    )

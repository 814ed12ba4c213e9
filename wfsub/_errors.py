"""The exceptions wfsub raises. Every message says what happened, where, and how to fix it.

    WfsubError
    ├── InvalidWorkflow      a term failed validation; carries every issue found
    ├── InvalidStartData     new_case data that does not fit its workflow's input model (also a ValueError)
    ├── CaseNotFound         no case with that id is registered
    ├── CaseExists           new_case was given an id that is already registered
    ├── CaseFailed           a step raised or a limit was hit; the step's exception is __cause__
    ├── CaseCancelled        the case was cancelled (by cancel(), a case timeout, or shutdown)
    ├── StepFailed           what the vm raises at a node when the workflow itself cannot go on there
    │   ├── LimitExceeded    a bound or limit was broken (loop max_iterations, mi count or max, call depth)
    │   ├── WaitTimeout      wait(..., timeout=) saw nothing arrive in time
    │   └── CompensationFailed  one or more compensations failed while a saga was compensated
    ├── RestoredError        an exception rebuilt from a snapshot or a journal (its type name and message)
    ├── EffectResultError    an effect returned data its case cannot take (not a mapping, not JSON, too large);
    │                        it is also a TypeError, and the effect is not retried for it
    ├── HeartbeatTimeout     an effect attempt sent no heartbeat for its heartbeat_timeout: it was cancelled and
    │                        failed with this (also a TimeoutError; the effect's retry policy applies)
    ├── SignalRejected       an input the case cannot take in its current state
    ├── MachineStateError    a vm input given in a wrong state (unknown effect id, ended machine, ...)
    ├── SnapshotMismatch     a snapshot was taken from a different program
    ├── SubstrateClosed      the Substrate was used outside its `async with` block
    ├── WorkflowNotRegistered  a durable case named a workflow the Substrate has not registered
    ├── ReplayDivergence     a journal does not apply to the program it is replayed on
    └── StoreError           the store refused or failed (its driver's exception is __cause__)
        ├── StoreConflict    a write broke a rule of the journal (a seq written twice, a second `end`), or
        │                    was fenced (another node owns the case now, at another epoch)
        └── CommitUnknown    the connection was lost while a write committed: it may or may not have been applied

Each is importable from `wfsub`, but `CommitUnknown`, which is in `wfsub.stores`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol


class _Issue(Protocol):
    """What InvalidWorkflow needs of an issue (a `ValidationIssue`)."""

    @property
    def path(self) -> str: ...

    @property
    def message(self) -> str: ...


class WfsubError(Exception):
    """Base class of every error wfsub raises on purpose.

    Every one pickles (a process pool or a task queue carries them): it comes back of its type, with its
    message and attributes as they were, without its `__init__` being called again (which takes other
    arguments than the message, and would word the message again)."""

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuilt, (type(self), self.args), self.__dict__ or None


def _rebuilt(cls: type[WfsubError], args: tuple[object, ...]) -> WfsubError:
    """An error from its pickle: `BaseException.__new__` sets its args (its message); unpickling then sets its
    attributes."""
    return cls.__new__(cls, *args)


def _where(loc: object) -> str:
    """A pydantic error location as a dotted path (`(payload)` for the payload itself)."""
    parts = [str(p) for p in loc] if isinstance(loc, tuple | list) else []
    return ".".join(parts) or "(payload)"


class InvalidWorkflow(WfsubError):
    """The workflow term has problems; `issues` lists all of them, each with its node path."""

    def __init__(self, issues: Sequence[_Issue], what: str = "workflow") -> None:
        self.issues = list(issues)
        lines = [f"  - {issue.path}: {issue.message}" for issue in self.issues]
        count = len(self.issues)
        super().__init__(
            f"invalid {what}: {count} issue{'s' if count != 1 else ''}\n" + "\n".join(lines)
        )


class InvalidStartData(WfsubError, ValueError):
    """The data given to start a case does not fit the input model its workflow was registered with
    (`Workflow(term, input=Model)`); `errors` are pydantic's, `workflow` the registered name. Nothing was started."""

    def __init__(
        self, workflow: str, model: type, errors: Sequence[Mapping[str, object]], case_id: str | None = None
    ) -> None:
        self.workflow = workflow
        self.model = model
        self.case_id = case_id
        self.errors = [dict(e) for e in errors]
        shown = "; ".join(f"{_where(e.get('loc'))}: {e.get('msg')}" for e in errors)
        which = f" {case_id!r}" if case_id is not None else ""
        super().__init__(
            f"cannot start case{which} of workflow {workflow!r}: its data does not fit {model.__name__} ({shown}); "
            f"nothing was started: pass data that validates against {model.__name__}"
        )


def queued_start_refused(error: InvalidStartData) -> str:
    """Why the owner failed a case a client queued with start data its workflow's input model refuses (the
    client checked the data against the model's JSON Schema; the owner validates it with the model itself)."""
    shown = "; ".join(f"{_where(e.get('loc'))}: {e.get('msg')}" for e in error.errors)
    name = error.model.__name__
    return (
        f"case {error.case_id!r} of workflow {error.workflow!r} was queued with data that does not fit {name} "
        f"({shown}); its owner failed it before it ran: start a new case with data that validates against {name}"
    )


class CaseNotFound(WfsubError, KeyError):
    """No case with this id is known to the Substrate (never started, or dropped by retention)."""

    def __init__(self, case_id: str) -> None:
        self.case_id = case_id
        # (an id looked up may be of any length: one longer than any case may have is not echoed whole)
        shown = repr(case_id) if len(case_id) <= 1000 else f"{case_id[:60]!r}... ({len(case_id):,} characters)"
        super().__init__(
            f"no case {shown}: check the id, or start it with new_case() first (an ended case is kept in "
            "memory up to the Substrate's `retain_ended` bound, and in its store until it is pruned)"
        )

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class CaseExists(WfsubError):
    """new_case was given a case id that is already registered with another workflow or other start data (the same
    start again returns the existing case, with or without a store)."""

    def __init__(self, case_id: str, differs: str | None = None) -> None:
        self.case_id = case_id
        self.differs = differs  # what differs from the existing case's start (its workflow, data), where known
        if differs is None:
            text = f"case {case_id!r} already exists: pass another case_id, or omit it to get a fresh one"
        else:
            text = (
                f"case {case_id!r} already exists with {differs}: a start repeated with the same workflow and "
                "start data returns the existing case; pass another case_id for another case"
            )
        super().__init__(text)

    @classmethod
    def triggered(cls, case_id: str, schedule: str) -> CaseExists:
        """`trigger_schedule` in a second that already started the schedule's case of that second."""
        error = cls.__new__(cls)
        error.case_id = case_id
        error.differs = None
        WfsubError.__init__(
            error,
            f"schedule {schedule!r} already started case {case_id!r} this second (a trigger, or its slot): a "
            "triggered case is named by the second it starts in, so trigger it again in a second, or follow that case",
        )
        return error

    @classmethod
    def dedup(cls, case_id: str, queue: str, key: str, holder: str) -> CaseExists:
        """A queued start refused: a live case of the queue holds its `dedup` key."""
        error = cls.__new__(cls)
        error.case_id = case_id
        error.differs = f"dedup key {key!r}"
        WfsubError.__init__(
            error, f"case {case_id!r} was not started: case {holder!r} of queue {queue!r} is live (queued or "
            f"running) with dedup key {key!r}; wait for it to end, or pass another dedup key"
        )
        return error


class CaseFailed(WfsubError):
    """A step of the case raised (the exception is `__cause__`) or a limit was hit.

    `traceback` is the cause's traceback as text: a failed case keeps it instead of the frames themselves, so
    `__cause__.__traceback__` is None. `record` is the error record of a failure at a node (`type`, `message`,
    `path`, `compensated`: what its sagas compensated, `cause`), or None.
    """

    def __init__(self, case_id: str | None, path: str, message: str) -> None:
        self.case_id = case_id
        self.path = path
        self.reason = message
        self.traceback: str | None = None
        self.record: dict[str, object] | None = None
        where = f"case {case_id!r} failed" if case_id is not None else "case failed"
        super().__init__(f"{where} at {path}: {message}")


class CaseCancelled(WfsubError):
    """The case was cancelled before it could finish."""

    def __init__(self, case_id: str | None, reason: str = "cancelled") -> None:
        self.case_id = case_id
        self.reason = reason
        super().__init__(f"case {case_id!r} was cancelled: {reason}")


class SignalRejected(WfsubError):
    """The case cannot take this input now (ended case, unknown signal or region, closed MI, ...).

    `case_id` (None for a bare Machine), `action` (what was attempted), `path` (the node path concerned: the
    region's, the mi's, or the workflow's root) and `reason` are kept as attributes. Every rejection is made by
    one of the constructors below, so the wording is the same wherever it is raised.
    """

    def __init__(
        self, case_id: str | None, action: str, reason: str, *, path: str | None = None, shown: bool = True
    ) -> None:
        self.case_id = case_id
        self.action = action
        self.reason = reason
        self.path = path
        self.errors: list[dict[str, object]] = []  # a payload that does not fit its model: pydantic's errors
        who = f"case {case_id!r}" if case_id is not None else "the case"
        where = f" (at {path})" if path and shown else ""  # not shown: the action names it, or it says nothing
        super().__init__(f"{who} cannot {action}{where}: {reason}")

    @classmethod
    def ended(cls, case_id: str | None, action: str, state: str, path: str | None = None) -> SignalRejected:
        reason = f"it has already ended ({state}); check status(case_id) before sending it inputs"
        return cls(case_id, action, reason, path=path, shown=False)  # the root's path would say nothing

    @classmethod
    def suspended(cls, case_id: str | None, action: str, why: str | None) -> SignalRejected:
        """The case is suspended: no registered version of its workflow can run it, so it takes no input but a
        cancel."""
        reason = (
            f"it is suspended: no registered version of its workflow can run it ({why or 'no reason recorded'}); "
            "register the version it started on (`wfsub replay` checks one before a deploy), or cancel it"
        )
        return cls(case_id, action, reason)

    @classmethod
    def poisoned(cls, case_id: str | None, action: str, why: str | None) -> SignalRejected:
        """The case is suspended as a poison case (it stopped its process each time it was recovered): nothing but
        `retry` brings it back, so it takes no input but a cancel."""
        reason = (
            f"it is suspended: {why or 'it stopped its process each time it was recovered'}; an input would run "
            "it again, so it takes none until it is retried (`retry(case_id)`) or cancelled"
        )
        return cls(case_id, action, reason)

    @classmethod
    def requeued(cls, case_id: str | None, action: str, queue: str | None) -> SignalRejected:
        """A retried case waiting in its queue for room: it takes inputs once it has started (a cancel ends it
        there)."""
        return cls.queued(case_id, action, queue, retried=True)

    @classmethod
    def queued(cls, case_id: str | None, action: str, queue: str | None, *, retried: bool = False) -> SignalRejected:
        """A case waiting in its queue for room (never started, or `retried`): it takes inputs once it has started
        (a cancel ends it there)."""
        reason = (
            f"it is queued: {'retried, ' if retried else ''}it waits in its queue"
            f"{'' if queue is None else f' {queue!r}'} for room and takes inputs once it has started; send it "
            "again then, or cancel it to withdraw it"
        )
        return cls(case_id, action, reason)

    @classmethod
    def not_ended(cls, case_id: str | None, action: str, state: str) -> SignalRejected:
        """A case that has not ended cannot be deleted (or otherwise treated as over)."""
        reason = (
            f"it has not ended (it is {state}); only an ended case can be deleted: cancel it first "
            "(`cancel(case_id)`), or wait for it to end"
        )
        return cls(case_id, action, reason)

    @classmethod
    def inputs_pending(
        cls, case_id: str | None, pending: Sequence[tuple[int, str]], child: str | None = None
    ) -> SignalRejected:
        """`delete` of an ended case for which inputs (inbox id, kind) wait in the store's inbox (or in the inbox
        of `child`, a child it waited for, deleted with it): a `retry` or `fork` queued while no owner ran would
        be lost with it."""
        shown = ", ".join(f"{kind} (inbox id {inbox_id})" for inbox_id, kind in pending)
        whose = "it" if child is None else f"its child {child!r} (deleted with it)"
        reason = (
            f"inputs sent to {whose} wait in the store's inbox, not yet taken by the Substrate that owns the store: "
            f"{shown}; deleting it now would drop them. Let an owner take them first (open a Substrate on the store, "
            "or wait for the one that runs: it applies a retry or fork, or refuses the input with a reason), then "
            "delete it"
        )
        return cls(case_id, "be deleted", reason)

    @classmethod
    def children_live(
        cls, case_id: str | None, children: Sequence[tuple[str, str]], state: str | None
    ) -> SignalRejected:
        """`delete` of an ended case (in `state`) a child of which it waited for with on_parent_cancel="cancel"
        (child id, state) has not ended: that child would be cancelled with its parent, and it would no longer be
        found to be if its parent were gone. Only a cancelled parent's cancel reaches it; a parent that failed (or
        completed) ended while the child was ended too, so a live child was re-opened by a retry since."""
        shown = ", ".join(f"{child!r} ({now})" for child, now in children)
        if state == "cancelled":
            reason = (
                f"children it waited for, cancelled with it (on_parent_cancel='cancel'), have not ended: {shown}; "
                "their cancel is under way (unless a retry re-opened them since). Delete it once they have ended "
                "(`await_case(child)`), or cancel them with compensate=False to end them at once"
            )
        else:
            reason = (
                f"children it waited for have not ended: {shown}; they ended before it did ({state or 'ended'}) and "
                "a retry re-opened them since, and nothing cancels them (the parent was not cancelled). Delete it "
                "once they have ended (`await_case(child)`), or cancel them"
            )
        return cls(case_id, "be deleted", f"{reason}; a delete removes the children it waited for with it")

    @classmethod
    def not_retryable(cls, case_id: str | None, state: str, why: str | None = None) -> SignalRejected:
        """`retry` of a case that is not failed (nor suspended as a poison case), or whose failure compensated."""
        if why is None:
            why = (
                f"it is {state}, and retry re-opens a failed case (or one suspended after too many recoveries); "
                "look at its state first (`status()`, or `wfsub show`)"
            )
        return cls(case_id, "be retried", why)

    @classmethod
    def reused_request_id(
        cls, case_id: str | None, action: str, request_id: str, used_by: str, kind: str
    ) -> SignalRejected:
        """An input whose request_id an input of another kind of the same case used: a request id names one
        input of one kind, so this is not a retry of that input (and is not applied)."""
        return cls(
            case_id, action,
            f"request_id {request_id!r} was used by {_a(used_by)} of this case, and a request id names one input; "
            f"pass a fresh request_id for this {kind} (repeat an id only to retry the same call)",
        )

    @classmethod
    def refused_by_owner(cls, case_id: str | None, action: str, reason: str) -> SignalRejected:
        """A `retry` or `fork` sent through the store's inbox that the owning Substrate refused (its words)."""
        return cls(case_id, action, f"the Substrate that owns it refused: {reason}")

    @classmethod
    def unknown_signal(
        cls, case_id: str | None, name: str, known: Mapping[str, Sequence[str]], waiting: Mapping[str, str] | None
    ) -> SignalRejected:
        """No wait of the workflow takes signal `name`. `known`: each signal the workflow waits for -> the node
        paths of its waits; `waiting`: each signal a thread waits for now -> where it waits."""
        listed = ", ".join(f"{n} at {' and '.join(paths)}" for n, paths in sorted(known.items())) or "none"
        now = _waiting_now(waiting)
        return cls(
            case_id,
            f"take signal {name!r}",
            f"the workflow never waits for signal {name!r} (it waits for: {listed}){now}; check the signal name",
        )

    @classmethod
    def invalid_payload(
        cls, case_id: str | None, name: str, model: type, errors: Sequence[Mapping[str, object]],
        paths: Sequence[str], waiting: Mapping[str, str] | None,
    ) -> SignalRejected:
        """The payload of signal `name` does not fit the model of its wait (at `paths`)."""
        shown = "; ".join(f"{_where(e.get('loc'))}: {e.get('msg')}" for e in errors)
        now = "" if waiting is None or waiting.get(name) in paths else _waiting_now(waiting)
        rejected = cls(
            case_id,
            f"take signal {name!r} at {' or '.join(paths)}",
            f"its payload does not fit {model.__name__} ({shown}){now}; send a payload that validates against it",
            path=paths[0] if paths else None,
            shown=False,
        )
        rejected.errors = [dict(e) for e in errors]
        return rejected

    @classmethod
    def unknown_region(
        cls, case_id: str | None, action: str, name: str, known: Iterable[str], path: str
    ) -> SignalRejected:
        listed = ", ".join(sorted(known)) or "none"
        return cls(
            case_id,
            action,
            f"no region {name!r} in this workflow (regions: {listed}); regions are made by scope(name, ...) "
            "and mi(..., name=...)",
            path=path,
            shown=False,  # the root's path: no region of that name is anywhere
        )

    @classmethod
    def inactive_region(cls, case_id: str | None, action: str, name: str, path: str) -> SignalRejected:
        reason = f"region {name!r} is not active now: it was not entered yet or has ended"
        return cls(case_id, action, reason, path=path)

    @classmethod
    def refused(cls, case_id: str | None, action: str, reason: str, path: str) -> SignalRejected:
        """Any other refusal of a region operation (the reason says why and what to do instead)."""
        return cls(case_id, action, reason, path=path)

    @classmethod
    def check_refused(cls, case_id: str | None, kind: str, name: str, reason: str, path: str) -> SignalRejected:
        """The `check=` of the wait at `path` refused the signal or update `name`: `reason` is its text, kept
        as the error's `reason` so the sender can show it as it was written."""
        rejected = cls(case_id, f"take {kind} {name!r}", reason, path=path)
        rejected.reason = reason
        return rejected

    @classmethod
    def passed(cls, case_id: str | None, name: str, reason: str, at: str) -> SignalRejected:
        """No wait for update `name` can be reached any more from where the case is (`at`): it would never be
        answered (a double-clicked approve). `reason` names the waits passed and where the case is."""
        return cls(case_id, f"take update {name!r}", reason, path=at)

    @classmethod
    def withdrawn(cls, case_id: str | None, name: str, why: str, at: str) -> SignalRejected:
        """The thread that took update `name` was withdrawn at `at` before the reply step ahead of it ran."""
        return cls(
            case_id, f"answer update {name!r}",
            f"the thread that took it was withdrawn before its reply step ran: {why}; the update was applied (its "
            "payload is in the case data), only its answer never came",
            path=at,
        )

    @classmethod
    def as_update(cls, refused: SignalRejected, name: str) -> SignalRejected:
        """A signal's refusal said of the update `name` that was refused for the same reason."""
        action = refused.action
        if action.startswith("take signal"):
            action = "take update" + action[len("take signal"):]
        shown = refused.path is not None and f" (at {refused.path}):" in str(refused)
        again = cls(refused.case_id, action, refused.reason, path=refused.path, shown=shown)
        again.errors = refused.errors
        return again

    @classmethod
    def not_an_update(
        cls, case_id: str | None, name: str, updates: Iterable[str], known: Iterable[str]
    ) -> SignalRejected:
        """`name` is not a name the workflow answers: no wait(name, reply=...) and no reply(name, ...) step."""
        listed = ", ".join(repr(n) for n in sorted(updates)) or "none"
        if name in set(known):
            fix = (f"the workflow waits for signal {name!r} but never answers it: send it as a signal instead (a "
                   f"signal call, or `wfsub signal`), or give its wait reply=fn or add a reply({name!r}, fn) step")
        else:
            fix = f"the workflow never waits for {name!r}; check the name"
        return cls(case_id, f"take update {name!r}", f"it answers no update of that name (updates: {listed}); {fix}")


def update_timeout(case_id: str, name: str, timeout: float) -> TimeoutError:
    """An update call waited `timeout` seconds without an answer (the update stays with the case)."""
    return TimeoutError(
        f"update {name!r} of case {case_id!r} got no answer within {timeout:g}s; the case keeps the update: call "
        "again with the same request_id to wait for its answer"
    )


def _a(kind: str) -> str:
    """`kind` with its article, as a sentence names an input ("a signal", "an update")."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def answer_gone(case_id: str, name: str, request_id: str, kept: int) -> SignalRejected:
    """A repeated update whose first call was applied long ago: its answer is no longer kept."""
    return SignalRejected(
        case_id, f"take update {name!r}",
        f"request_id {request_id!r} was applied before, and its answer is no longer kept (a case keeps the answers "
        f"of its latest {kept} updates); send a new update with a new request_id",
    )


def owner_refused(case_id: str, action: str, reason: str) -> SignalRejected:
    """The owner refused an input that came through the inbox (the reason it marked on the inbox row)."""
    return SignalRejected(case_id, action, f"the case's owner refused it: {reason}")


def check_failed(fn: object, exc: BaseException) -> str:
    """The refusal text when a `check=` function itself raised: the input is refused, with what went wrong."""
    label = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"check function {label} raised {type(exc).__name__}: {exc}; fix the check (it must return None or a str)"


def check_not_str(fn: object, value: object) -> str:
    label = getattr(fn, "__qualname__", None) or type(fn).__name__
    return (f"check function {label} returned {value!r} ({type(value).__name__}); a check returns None to take the "
            "input or a str saying why it is refused")


def reply_failed(name: str, fn: object, problem: str) -> str:
    """The failure text of a reply function that raised or returned a value that is not JSON."""
    label = getattr(fn, "__qualname__", None) or type(fn).__name__
    return f"reply function {label} for update {name!r} {problem}"


def _waiting_now(waiting: Mapping[str, str] | None) -> str:
    """Where the case waits for signals now, as a clause of a refusal (None: not known where the refusal is made,
    as for a case no process here runs: nothing is said)."""
    if waiting is None:
        return ""
    if not waiting:
        return "; the case waits for no signal now"
    return "; the case waits now for " + ", ".join(f"signal {n!r} at {p}" for n, p in sorted(waiting.items()))


NOTHING = object()
"""`bad_input(..., NOTHING)`: the refusal is about something missing, not a value given."""


def bad_input(
    problem: str, value: object, *, fix: str, case_id: str | None = None, error: type[Exception] = TypeError
) -> Exception:
    """The refusal of an input's field before it reaches its case (a wrong type, a blank reason, an unknown kind):
    what was wrong, the value given, the case it was for, and the fix. Every door (the API, the inbox, the
    command) refuses with this one wording."""
    got = "" if value is NOTHING else f", got {type(value).__name__} {value!r}"
    where = "" if case_id is None else f" (an input for case {case_id!r})"
    return error(f"{problem}{got}{where}: {fix}")


def bad_option(
    owner: str, problem: str, value: object, *, fix: str, error: type[Exception] = ValueError
) -> Exception:
    """The refusal of a configuration object's field (a `Schedule`, a `Queue`, what a Substrate is given): which
    object, what was wrong, the value given, and the fix."""
    got = "" if value is NOTHING else f", got {type(value).__name__} {value!r}"
    return error(f"{owner}: {problem}{got}: {fix}")


def unknown_name(what: str, name: object, known: Iterable[str], *, fix: str) -> ValueError:
    """A name (of a schedule, a queue) that is not configured: the names there are, and the fix."""
    listed = ", ".join(repr(n) for n in sorted(known)) or "none"
    return ValueError(f"no {what} {name!r} (configured: {listed}): {fix}")


def too_deep(what: str, limit: int, *, case_id: str | None = None) -> ValueError:
    """The refusal of an input (a payload, items, start data) nested deeper than `limit` levels of lists and
    dicts: JSON that deep is walked recursively on its way (copies, models, encoders) and would fail there."""
    error = bad_input(
        f"{what}: nested deeper than {limit} levels of lists and dicts, the most an input may nest", NOTHING,
        case_id=case_id, error=ValueError,
        fix="flatten it (e.g. a list of records that name their parent) or keep it elsewhere and pass a reference",
    )
    assert isinstance(error, ValueError)
    return error


class MachineStateError(WfsubError):
    """A vm input was given in a state that cannot take it."""


class StepFailed(WfsubError):
    """A failure the vm raises at a node: no branch matched, a region step was refused, a count was invalid, ...

    Like an exception a task raises, it is a failure at the node: `scope(on_error=...)` catches it, and an
    uncaught one fails the case with it as `CaseFailed.__cause__`. `path` is the node's path.
    """

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.reason = message
        super().__init__(f"at {path}: {message}")


class LimitExceeded(StepFailed):
    """A bound or limit was broken at a node (loop max_iterations, mi count or max, call depth, ...)."""


class WaitTimeout(StepFailed):
    """`wait(..., timeout=)` saw no signal arrive in time."""


class CompensationFailed(StepFailed):
    """Compensations failed while a saga was compensated; `failures` has one record per failed compensation
    (`type`, `message`, `path`), and the failure being compensated, if any, is `__cause__`."""

    def __init__(self, path: str, failures: Sequence[Mapping[str, object]]) -> None:
        self.failures = [dict(f) for f in failures]
        listed = "; ".join(f"{f['path']}: {f['type']}: {f['message']}" for f in self.failures)
        n = len(self.failures)
        super().__init__(path, f"{n} compensation{'s' if n != 1 else ''} failed ({listed})")


class SnapshotMismatch(WfsubError):
    """Machine.restore was given a snapshot of a different program."""


class SubstrateClosed(WfsubError):
    """The Substrate is not open: use it inside `async with Substrate(...) as sub:`."""

    def __init__(self, what: str, *, client: bool = False) -> None:
        how = (
            "the Client is not open; call it inside `async with wfsub.Client(store) as client:`" if client
            else "the Substrate is not open; call it inside `async with Substrate() as sub:`"
        )
        super().__init__(f"cannot {what}: {how}")


class StoreError(WfsubError):
    """The store refused or failed: `store` names it (a path or URL); the driver's exception is `__cause__`.

    The message says what was attempted, on which store, what went wrong and, where there is one, the fix.
    """

    def __init__(self, store: str, message: str) -> None:
        self.store = store
        super().__init__(f"store {store}: {message}")


def newer_store(store: str, what: str, version: int, reads: int, package: str = "wfsub") -> StoreError:
    """A store written by a newer wfsub than this one: `what` is the file or schema, `package` what to upgrade
    (`'wfsub[postgres]'`). The fix depends on how wfsub is installed (`upgrade_advice`)."""
    return StoreError(
        store,
        f"{what} has store layout version {version}, newer than this wfsub reads (up to {reads}): a newer wfsub "
        f"wrote it. {upgrade_advice(package, checkout_of())}. This wfsub leaves it untouched",
    )


def upgrade_advice(package: str, checkout: str | None) -> str:
    """How to get a newer wfsub: `pip install -U` for an installed package (`checkout` None); for one run from a
    checkout (an editable / develop install, or a source tree on the path: `checkout_of()`), updating it."""
    if checkout is None:
        return f"To open it, upgrade wfsub: pip install -U {package}"
    return (
        f"To open it, update the checkout this wfsub runs from ({checkout}): git pull there, or check out a newer "
        "release (pip install -U does not change a checkout), then run pip install -e . there if its dependencies "
        "changed"
    )


def checkout_of(package_dir: str | None = None, direct_url: str | None = None) -> str | None:
    """The source checkout a wfsub runs from, or None when it is an installed package.

    wfsub runs from a checkout when its package directory (`package_dir`; None: this wfsub's own) is not inside
    a site-packages or dist-packages directory (an editable install, `pip install -e .`, or a source tree on
    sys.path). The checkout is then the directory its editable install's `direct_url.json` names (`direct_url`:
    that file's text; for this wfsub, read from its installed distribution), else the package's parent."""
    import json
    from pathlib import Path

    if package_dir is None:
        here = Path(__file__).resolve().parent
        direct_url = _direct_url()
    else:
        here = Path(package_dir).resolve()
    if any(part in ("site-packages", "dist-packages") for part in here.parts):
        return None
    if direct_url:
        try:
            info = json.loads(direct_url)
        except ValueError:
            info = None
        url = info.get("url") if isinstance(info, dict) else None
        dir_info = info.get("dir_info") if isinstance(info, dict) else None
        editable = isinstance(dir_info, dict) and dir_info.get("editable")
        if editable and isinstance(url, str) and url.startswith("file://"):
            from urllib.parse import unquote, urlparse

            root = Path(unquote(urlparse(url).path))
            if here.is_relative_to(root):
                return str(root)
    return str(here.parent)


def _direct_url() -> str | None:
    """The installed distribution's `direct_url.json` (PEP 610), or None."""
    from importlib import metadata

    try:
        return metadata.distribution("wfsub").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None


class RestoredError(WfsubError):
    """An exception rebuilt from stored data (a snapshot, a journal record): the original type is gone, its name
    (`type_name`) and message are kept, and `str()` shows both."""

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        self.message = message
        super().__init__(f"{type_name}: {message}")


class EffectResultError(WfsubError, TypeError):
    """An effect returned (it raised nothing) data its case cannot take: not a mapping of updates, not JSON for a
    durable case, or more JSON than `max_payload_bytes`. The effect is not retried for it: an attempt that returns
    the same data would be refused the same way. `problem` says what the data is and where in it."""

    def __init__(self, name: str, path: str, problem: str, fix: str) -> None:
        self.name = name
        self.path = path
        self.problem = problem
        super().__init__(f"effect {name!r} at {path} returned {problem}: {fix} (a result like this is not retried)")

    @classmethod
    def not_json(cls, name: str, path: str, problem: str) -> EffectResultError:
        return cls(name, path, f"data that is not JSON ({problem})",
                   "a durable case keeps its data as JSON; return only dicts, lists, str, numbers, bool and None")

    @classmethod
    def too_large(cls, name: str, path: str, problem: str) -> EffectResultError:
        return cls(name, path, "more data than its case may keep", problem)

    @classmethod
    def not_mapping(cls, name: str, path: str, got: object) -> EffectResultError:
        return cls(name, path, type(got).__name__,
                   "an effect must return a Mapping of updates to the case data, or None")


def effect_failure_text(label: str, error: BaseException) -> str:
    """Why an effect's step failed, as the case's failure says it: what the effect raised, or (an
    `EffectResultError`, live or rebuilt from a journal) what it returned that its case could not take."""
    if error_name(error) == EffectResultError.__name__:
        return error_text(error)
    return f"effect {label} raised {error_name(error)}: {error_text(error)}"


def error_name(exc: BaseException) -> str:
    """An exception's type name; for one rebuilt from a journal, the original type's name."""
    return exc.type_name if isinstance(exc, RestoredError) else type(exc).__name__


def error_text(exc: BaseException) -> str:
    """An exception's message; for one rebuilt from a journal, the original message (as the live run saw it)."""
    return exc.message if isinstance(exc, RestoredError) else str(exc)


class WorkflowNotRegistered(WfsubError):
    """A case was started from (or recorded with) a workflow name that is not registered."""

    def __init__(self, name: object, registered: Iterable[str], store: str | None = None) -> None:
        self.name = name
        if store is not None:  # asked of a store by a process that registers nothing (a Client)
            super().__init__(
                f"no workflow {name!r} is registered with the store {store}: no Substrate that opened it with "
                "workflows= registered that name; check the name (a client starts cases only of workflows a "
                "Substrate registered with the store)"
            )
            return
        listed = ", ".join(sorted(registered)) or "none"
        super().__init__(
            f"no workflow {name!r} is registered (registered: {listed}); with a store, cases start only from "
            "workflows given as Substrate(workflows={name: term}) so that they can be recovered and replayed"
        )


class ReplayDivergence(WfsubError):
    """A journal does not apply to the program it is replayed on: the first record that does not apply, what the
    journal expected, what happened instead, and the tasks run since the previous record."""

    def __init__(
        self, case_id: str | None, seq: int, kind: str, expected: str, happened: str, tasks: Sequence[str] = (),
        names: Sequence[str] | None = None,
    ) -> None:
        self.case_id = case_id
        self.seq = seq
        self.kind = kind
        self.expected = expected
        self.happened = happened
        self.tasks = list(tasks)  # their node paths
        if names is None:  # the digest's own list of tasks knows their names
            names = getattr(tasks, "names", None) or [""] * len(self.tasks)
        self.task_names = [*names, *[""] * (len(self.tasks) - len(names))][: len(self.tasks)]  # (their names)
        ran = ", ".join(
            f"task {name!r} at {path}" if name else f"the task at {path}"
            for name, path in zip(self.task_names, self.tasks, strict=True)
        ) or "none"
        super().__init__(
            f"case {case_id!r} diverges at journal record {seq} ({kind}): expected {expected}, but {happened}; "
            f"tasks run since the previous record: {ran}. A task that reads a clock, randomness or global state, "
            "or a changed workflow, makes a journal diverge: keep tasks pure, or register the version the case "
            "started on"
        )


def bad_compact_after(value: object) -> ValueError:
    """The refusal of `Substrate(compact_after=...)`: not None and not an int of at least 2."""
    error = bad_input(
        "compact_after must be an int >= 2 (the journal records a live case keeps before it is compacted) or None",
        value, error=ValueError,
        fix="pass e.g. compact_after=1000 (the default), or None to keep every record of every case",
    )
    assert isinstance(error, ValueError)
    return error


def compacted_divergence(
    case_id: str | None, seq: int, taken_on: object, program: str, why: str | None = None
) -> ReplayDivergence:
    """A compacted journal (its first record a `snapshot`) replayed on a program its snapshot cannot be restored
    on: another version, or a snapshot or bytecode format this wfsub does not read."""
    taken = str(taken_on)[:16]
    happened = why or (
        f"it is replayed on program {program[:16]}: the records before seq {seq} were removed by compaction, so the "
        "case replays only on the version its snapshot was taken on"
    )
    return ReplayDivergence(
        case_id, seq, "snapshot",
        f"program {taken} (the version the journal was compacted on)",
        f"{happened}; register that version beside the newer ones (a compacted case runs on, or migrates from, "
        "no other)",
    )


class StoreConflict(StoreError):
    """A write was refused because it conflicts with what the store holds (a journal seq written twice, a case's
    second `end`): that write alone was undone. A `start` record that conflicts means the case id is taken."""


class SchedulePaused(StoreConflict):
    """Internal: the start of a schedule's slot (a case, or its queue item) was refused because the schedule is
    paused, checked in the transaction that would have written it: no slot starts after `pause_schedule` returned,
    whatever the node read before."""

    @classmethod
    def refused(cls, store: str, schedule: str, case_id: str) -> SchedulePaused:
        return cls(store, paused_slot(schedule, case_id))


def paused_slot(schedule: str, case_id: str) -> str:
    return (
        f"schedule {schedule!r} is paused: the case {case_id!r} of its slot was not started (nothing was written); "
        "resume_schedule lets its next slots start"
    )


class CommitUnknown(StoreError):
    """The connection to the database was lost after a write was sent and before its COMMIT was confirmed: the
    write may or may not have been applied. Retry it with the same `request_id` (a repeated id applies once), or
    read the case back (`load()`, `journal()`) to see which it was."""


class HeartbeatTimeout(WfsubError, TimeoutError):
    """An attempt of an effect with `heartbeat_timeout=` went that long without calling `wfsub.heartbeat()`: it was
    cancelled and failed with this. The effect's retry policy applies (list it in `Retry.non_retryable` to fail at
    once). `details` are the last heartbeat's details of that attempt (None if it sent none)."""

    def __init__(self, name: str, path: str, timeout: float, attempt: int, details: object = None) -> None:
        self.name = name
        self.path = path
        self.timeout = timeout
        self.attempt = attempt
        self.details = details
        super().__init__(
            f"effect {name!r} at {path} sent no heartbeat for {timeout:g}s (its heartbeat_timeout) in attempt "
            f"{attempt}, so the attempt was cancelled; call wfsub.heartbeat() more often than every {timeout:g}s "
            "while the effect works, or give it a longer heartbeat_timeout"
        )


def heartbeat_outside_effect() -> RuntimeError:
    """`wfsub.heartbeat()` called where no effect runs."""
    return RuntimeError(
        "heartbeat() is called outside an effect: call it from the async function given to effect() (or from a "
        "task that function awaits), where it tells the runtime the effect is still working"
    )


def heartbeat_not_json(name: str, path: str, problem: str) -> TypeError:
    """`wfsub.heartbeat(details)` given details that are not JSON."""
    return TypeError(
        f"heartbeat details of effect {name!r} at {path} are not JSON ({problem}): they are kept in the case row "
        "and given to the next attempt, so pass only dicts, lists, str, numbers, bool and None"
    )


def heartbeat_too_large(name: str, path: str, size: int, limit: int) -> ValueError:
    """`wfsub.heartbeat(details)` in a durable case given more JSON than the Substrate's `max_payload_bytes`."""
    return ValueError(
        f"heartbeat details of effect {name!r} at {path} are {size:,} bytes of JSON, more than "
        f"max_payload_bytes={limit:,}: they are kept in the case row, so keep large details elsewhere (a file, an "
        "object store) and pass a reference, or raise Substrate(max_payload_bytes=...)"
    )


def outbound_value(label: str, path: str, what: str, value: object, fix: str, case_id: str | None) -> Exception:
    """A `start_case` or `signal_case` step whose function (`case_id=`, `data=`, `payload=`) returned what the step
    cannot use: it fails at its node with this text."""
    return bad_input(f"{label} at {path}: {what}", value, fix=fix, case_id=case_id)


def store_refused(error: StoreError, case_id: str, path: str, what: str) -> StoreError:
    """A `start_case` or `signal_case` step whose write the store refused for good (`refused_for_good`: data it
    cannot hold): the step fails with this, naming the case, the node path and the store's reason."""
    return StoreError(
        error.store,
        f"{what} at {path} of case {case_id!r} was refused by the store, which would refuse it again however often "
        f"it is sent, so the step fails rather than retrying ({str(error).removeprefix(f'store {error.store}: ')}); "
        "change what the step sends (its case_id=, data= or payload=), or catch the failure with "
        "scope(on_error=...)",
    )


def not_our_child(child_id: str, parent: str, path: str, other: str | None) -> CaseExists:
    """`start_case` found a case with the child's id that this parent did not start (`other`: its parent)."""
    owner = "no parent" if other is None else f"parent {other!r}"
    return CaseExists(
        child_id,
        f"{owner}, not the case {parent!r} whose start_case at {path} asked for it (a child's id must be its own: "
        "pass start_case(..., case_id=fn) returning an id no other case uses",
    )

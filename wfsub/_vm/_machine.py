"""Machine: the front a driver sees. The whole driver contract reads here, in one place.

A driver (the runtime's case actor, a test, a replay tool) creates a Machine for a compiled Program, calls
`run(quanta)`, starts what the `RunResult` asks for (effects, timers), stops what it cancels, and reports back
through the input methods. The vm never awaits, never reads a clock and never draws a random number: signals,
effect results, timer firings, cancels and scheduler choices all come in through these methods, so a case is
replayable from the list of its inputs. Inputs only record; the next `run()` reports what follows from them.

The front checks every argument and refuses what the case cannot take (`SignalRejected`, naming the case and
the node path, or `MachineStateError` for ids it never issued) before anything changes; the interpreter behind
it (`_interp.py`) trusts what it is given.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any, TypeVar, overload

from pydantic import ValidationError

from .._errors import MachineStateError, SignalRejected
from .._program import DEFAULT_MAX_INSTANCES, Program, signal_waits
from ._events import LEVELS, VmEvent
from ._interp import NO_OUT, Interp
from ._records import FoldedOutputs, Frame, MIFrame, Token
from ._requests import EffectRequest, TimerRequest
from ._result import RunResult, RunStatus
from ._schedulers import Scheduler
from ._snapshot import give, take
from ._updates import owed, owes, take_answers, waiting_check

_R = TypeVar("_R", EffectRequest, TimerRequest)


def _from_vm(attribute: str, doc: str | None = None) -> Any:
    """A read-only attribute of the interpreter, seen through the front: a property whose getter is all C (no
    Python frame per read: the runtime reads these on every burst). Typed by the annotation where it is used."""
    return property(attrgetter(f"_vm.{attribute}"), doc=doc)


_BLOCKED, _FAILED = RunStatus.BLOCKED, RunStatus.FAILED
FOLD_AT = 256  # a durable case's task outputs held raw between records before a burst encodes them (see run)
_EFFECT_ID: Callable[[EffectRequest], int] = attrgetter("effect_id")
_TIMER_ID: Callable[[TimerRequest], int] = attrgetter("timer_id")


class Machine:
    """The execution state of one case of a Program, driven one explicit input at a time.

    `case_id` only labels the machine's errors (the runtime passes its case id). `max_instances` bounds an mi
    without `max=`: one that would start more fails at the mi before anything is allocated. `workflow` (a
    registered name) is named by the `case_started` event.
    """

    __slots__ = ("_vm", "case_id")

    def __init__(
        self,
        program: Program,
        data: Mapping[str, Any] | None = None,
        *,
        scheduler: Scheduler | None = None,
        trace_level: str = "none",
        case_id: str | None = None,
        max_instances: int = DEFAULT_MAX_INSTANCES,
        workflow: str | None = None,
    ) -> None:
        if not isinstance(program, Program):
            raise TypeError(f"Machine takes a compiled Program (wfsub.compile(term)), got {type(program).__name__}")
        if data is not None and not isinstance(data, Mapping):
            raise TypeError(f"case data must be a mapping (a dict of str keys), got {type(data).__name__}")
        _check_level(trace_level)
        if isinstance(max_instances, bool) or not isinstance(max_instances, int) or max_instances < 1:
            raise ValueError(f"max_instances must be an int >= 1, got {max_instances!r}")
        self.case_id = case_id
        self._vm = Interp(program, data or {}, scheduler, trace_level, max_instances)
        self._vm.workflow = workflow

    # -- what the driver reads ---------------------------------------------------------------------------

    program: Program = _from_vm("program")
    data: dict[str, Any] = _from_vm("data", "The case data (the live dict: copy it to keep it).")
    status: RunStatus = _from_vm("status")
    ended: bool = _from_vm("ended")
    steps: int = _from_vm("steps", "Instructions executed so far.")
    scheduler: Scheduler = _from_vm("scheduler")
    error: BaseException | None = _from_vm("error", "Failed: the step's exception (a CaseFailed for a limit).")
    error_path: str | None = _from_vm("error_path", "Failed: the node path.")
    error_message: str | None = _from_vm("error_message", "Failed: what happened.")
    failure_record: dict[str, Any] | None = _from_vm(
        "failure_record", "Failed at a node: the error record {type, message, path, compensated, cause}."
    )
    compensated: tuple[str, ...] = _from_vm(
        "compensated", "Cancelled with compensation: the steps the cancel's compensations undid, in order."
    )

    @property
    def trace_level(self) -> str:
        return self._vm.trace_level

    @trace_level.setter
    def trace_level(self, level: str) -> None:
        _check_level(level)
        self._vm.trace_level = level

    @property
    def pending_effects(self) -> int:
        """Effects requested and not yet answered or cancelled."""
        return len(self._vm.effects)

    @property
    def armed_timers(self) -> int:
        return len(self._vm.timers)

    def effect_ids(self) -> list[int]:
        """Ids of the effects in flight, oldest first."""
        return sorted(self._vm.effects)

    def timer_ids(self) -> list[int]:
        """Ids of the armed timers, oldest first."""
        return sorted(self._vm.timers)

    def live_regions(self) -> list[str]:
        return [name for name, acts in self._vm.regions.items() if acts]

    def threads_at(self) -> list[str]:
        """Node paths where the case's threads are now (walks the frame tree: a status read, not a hot path)."""
        return self._vm.threads_at()

    def awaited_signals(self) -> tuple[str, ...]:
        return self._vm.awaited_signals()

    def note(self, kind: str, path: str, detail: dict[str, Any]) -> None:
        """Record an event the driver observed (an effect retried) in the case's own event sequence, if traced."""
        vm = self._vm
        if vm.tl:
            vm.emit(kind, path, detail)

    @property
    def digesting(self) -> bool:
        return self._vm.outputs is not None

    @digesting.setter
    def digesting(self, on: bool) -> None:
        """Keep a running digest of task outputs (a durable case: see take_digest). Off by default: it costs
        one append per task and the untraced fast loop."""
        vm = self._vm
        if on and vm.outputs is None:
            vm.outputs = []
        elif not on:
            vm.outputs = vm.digest_hasher = None

    def take_digest(self) -> tuple[str, Sequence[str]]:
        """The running digest after the tasks run since the last call, and those tasks' node paths.

        The digest chains: it hashes the previous digest with what each task returned (and where), so two runs
        agree on it only if their tasks returned the same outputs in the same order. It costs in proportion to
        what the tasks returned, not to the size of the case's data. A task output that is not JSON is hashed by
        its repr.
        """
        vm = self._vm
        outputs = vm.outputs or []
        if not outputs:
            return vm.digest, []
        head = outputs[0]
        if type(head) is not FoldedOutputs:
            h = hashlib.blake2b(vm.digest.encode(), digest_size=8)
            h.update(_encoded(outputs).encode())
            vm.digest = h.hexdigest()
            vm.outputs = []
            return vm.digest, _Paths(vm.paths, _runs([], outputs), vm.program.labels)
        # the same bytes as the one-shot encoding of every pair: "[" + the pairs' texts joined by "," + "]"
        raw = outputs[1:]
        h = _hasher(vm, head).copy()
        if raw:
            h.update(("," + _encoded(raw)[1:-1]).encode())
        h.update(b"]")
        vm.digest = h.hexdigest()
        vm.outputs = []
        vm.digest_hasher = None
        return vm.digest, _Paths(vm.paths, _runs(head.runs, raw), vm.program.labels)

    @property
    def next_effect_id(self) -> int:
        """The id the next effect request will get: every id below it was requested at some point."""
        return self._vm.next_eid

    def take_events(self) -> list[VmEvent]:
        """The trace events recorded since the last call (the machine forgets them)."""
        vm = self._vm
        events = vm.events
        if not events:
            return []  # (an untraced machine keeps its shared empty tuple)
        vm.events = []
        return events

    # -- running -----------------------------------------------------------------------------------------

    def run(self, quanta: int = 1000, *, time: float | None = None) -> RunResult:
        """Run up to `quanta` steps; report the outcome and what the driver must start or stop.

        `time`: the time the driver's inputs have reached (epoch seconds: the time of the last input applied, from
        which the driver counts the timers this run arms). The vm keeps no clock; given it, a step whose due time
        the data names (`sleep(until=)`, `deadline=`) more than `MAX_SECONDS` later fails, as a length above it
        does. A replay passes the time of the same record, so it computes the same."""
        vm = self._vm
        vm.time = time
        steps = vm.run(quanta)
        outputs = vm.outputs
        if outputs is not None and len(outputs) > FOLD_AT:
            _fold(vm, outputs)
        status = vm.status
        result = RunResult(status, steps)
        # Hand over the lists that hold something; the vm keeps its empty ones. A request withdrawn in the
        # burst that made it is neither started nor cancelled: the driver never hears of it.
        if vm.out_effects:
            made, vm.out_effects = vm.out_effects, NO_OUT
            result.effects, vm.out_cancel_effects = _still_live(made, vm.out_cancel_effects, vm.effects, _EFFECT_ID)
        if vm.out_timers:
            armed, vm.out_timers = vm.out_timers, NO_OUT
            result.timers, vm.out_cancel_timers = _still_live(armed, vm.out_cancel_timers, vm.timers, _TIMER_ID)
        if vm.out_cancel_effects:
            result.cancelled_effects, vm.out_cancel_effects = list(vm.out_cancel_effects), NO_OUT
        if vm.out_cancel_timers:
            result.cancelled_timers, vm.out_cancel_timers = list(vm.out_cancel_timers), NO_OUT
        if status is _BLOCKED:
            result.signals = vm.awaiting
        elif status is _FAILED:
            result.error, result.error_path, result.error_message = vm.error, vm.error_path, vm.error_message
        return result

    def pending_requests(self) -> tuple[list[EffectRequest], list[TimerRequest]]:
        """Every effect in flight and timer armed, as requests: what a driver restarts after `restore`.

        The vm keeps no clock, so a re-armed timer runs its full length again unless the driver keeps
        deadlines of its own.
        """
        return self._vm.pending_requests()

    # -- inputs ------------------------------------------------------------------------------------------

    def check_signal(self, name: str, payload: Any = None) -> Any:
        """Raise what `deliver_signal(name, payload)` would raise, without delivering anything; return the payload
        as it would be stored (a payload checked against its wait's model is its model's JSON-mode dump)."""
        if not isinstance(name, str):
            raise TypeError(f"signal names are str, got {type(name).__name__} {name!r}")
        vm = self._vm
        if vm.ended:  # (tested here, so the action's text is built only for the error)
            self._check_open(f"take signal {name!r}")
        program = vm.program
        if name not in program.signals:
            raise SignalRejected.unknown_signal(self.case_id, name, self._wait_paths(), self._waiting())
        model = program.signal_models.get(name)
        if model is not None:
            try:
                payload = model.model_validate(payload).model_dump(mode="json")  # type: ignore[attr-defined]
            except ValidationError as exc:
                paths = self._wait_paths().get(name, [program.root_path])
                raise SignalRejected.invalid_payload(
                    self.case_id, name, model, exc.errors(include_url=False), paths, self._waiting()
                ) from None
        if program.guarded:  # the check= of the wait that would take it now, on the data as it is
            refused = waiting_check(vm, name, payload)
            if refused is not None:
                raise SignalRejected.check_refused(self.case_id, "signal", name, refused[0], refused[1])
        return payload

    def check_update(self, name: str, payload: Any = None) -> Any:
        """Raise what `deliver_update(name, payload, ...)` would raise, without delivering anything: a name the
        workflow answers (a wait with reply= or a reply step), then `check_signal`'s checks. Returns the payload
        as it would be stored."""
        if not isinstance(name, str):
            raise TypeError(f"update names are str, got {type(name).__name__} {name!r}")
        vm = self._vm
        if vm.ended:
            self._check_open(f"take update {name!r}")
        program = vm.program
        if name not in program.updates:
            raise SignalRejected.not_an_update(self.case_id, name, program.updates, program.signals)
        try:
            return self.check_signal(name, payload)
        except SignalRejected as exc:
            raise SignalRejected.as_update(exc, name) from None

    def deliver_update(self, name: str, payload: Any, update_id: str, *, checked: bool = False) -> None:
        """An update arrives: as `deliver_signal`, and its answer comes out in `take_answers()` under
        `update_id` (see `_vm._updates`). `checked=True`: `check_update` has passed (see `deliver_signal`)."""
        vm = self._vm
        if checked:
            if vm.ended:
                self._check_open(f"take update {name!r}")
            vm.signal(name, payload, update_id)
            return
        vm.signal(name, self.check_update(name, payload), update_id)

    def owes(self, update_id: str) -> bool:
        """Whether update `update_id` is buffered or owed by a thread: the case will answer it."""
        return owes(self._vm, update_id)

    def owed_updates(self) -> list[str]:
        """The ids of the updates buffered or owed by a thread: those the case will answer (see `owes`)."""
        return owed(self._vm)

    def take_answers(self) -> list[tuple[str | None, str, str, Any]]:
        """The answers the last bursts and inputs produced, oldest first, each (update id or None, kind, name,
        value): kind "answer" (the value), "refused" (the refusal; a plain signal's has id None), "passed" (no wait
        for it can be reached any more: [the refusal, where the case is]), "withdrawn" (its thread was withdrawn
        before its reply step: [why, where]), "error" (a reply function failed: the value is the failure's text) or
        "ended" (the case ended first)."""
        return take_answers(self._vm)

    def _wait_paths(self) -> dict[str, list[str]]:
        """Each signal the workflow waits for -> the node paths of the waits that take it (for a refusal)."""
        return signal_waits(self._vm.program)

    def _waiting(self) -> dict[str, str]:
        """Each signal a thread of the case waits for now -> the node path where the first such thread waits."""
        vm = self._vm
        return {name: vm.paths[vm.waiters[name].peek()[0].ip] for name in vm.awaited_signals()}

    def deliver_signal(self, name: str, payload: Any = None, *, checked: bool = False) -> None:
        """A signal arrives: wake the oldest waiter, else buffer it (persistent) or drop it (transient).

        `checked=True`: `check_signal(name, payload)` has passed and `payload` is what it returned (the runtime
        checks every input once, where it comes in); only whether the case has ended since is checked again."""
        vm = self._vm
        if checked:
            if vm.ended:
                self._check_open(f"take signal {name!r}")
            vm.signal(name, payload)
            return
        program = vm.program
        if type(name) is str and not vm.ended and name in program.signals and name not in program.signal_models \
                and not program.guarded:
            vm.signal(name, payload)  # the common case, checked inline: a known signal without a payload model
            return
        vm.signal(name, self.check_signal(name, payload))

    def complete_effect(
        self, effect_id: int, output: Mapping[str, Any] | None = None, *, error: BaseException | None = None
    ) -> bool:
        """An effect finished. False: its token was withdrawn (or the case ended) and the result is discarded."""
        vm = self._vm
        if not 0 < effect_id < vm.next_eid:
            raise MachineStateError(f"unknown effect id {effect_id}: this machine never requested it")
        if vm.ended:
            return False
        return vm.effect_done(effect_id, output, error)

    def fire_timer(self, timer_id: int) -> bool:
        """A timer is due. False: it was cancelled or its token withdrawn (a stale firing)."""
        vm = self._vm
        if not 0 < timer_id < vm.next_timer:
            raise MachineStateError(f"unknown timer id {timer_id}: this machine never armed it")
        return vm.timer_fired(timer_id)

    def cancel(self, reason: str = "cancelled", *, compensate: bool = True) -> None:
        """Cancel the whole case: every token, effect and timer is withdrawn.

        With `compensate` (the default) the active sagas compensate and the active scopes run their on_cancel
        first, innermost first; the case ends cancelled once they are done. `compensate=False`, or a second
        cancel while compensating, ends it at once.
        """
        self._check_open("cancel")
        self._vm.cancel_case(reason, compensate)

    def check_region(self, action: str, name: str) -> None:
        """Raise what a region operation on `name` would raise for an unknown region or an ended case."""
        if not isinstance(name, str):
            raise TypeError(f"region names are str, got {type(name).__name__} {name!r}")
        self._check_open(f"{action} {name!r}")
        program = self._vm.program
        if name not in program.regions:
            raise SignalRejected.unknown_region(
                self.case_id, f"{action} {name!r}", name, program.regions, program.root_path
            )

    def check_region_op(self, action: str, name: str, items: Sequence[Any] | None = None) -> None:
        """Raise what the region operation `action` ("cancel region", "complete region", "add instances to",
        "close instances of") on `name` would raise now, changing nothing: an unknown or inactive region, a
        refused completion or addition. A durable case checks an operation so before it journals it."""
        if action == "complete region":
            acts = self._activations(action, name)
            refused = self._vm.complete_refusal(name, acts)
            if refused is not None:
                raise SignalRejected.refused(self.case_id, f"{action} {name!r}", refused[1], self._path(refused[0]))
        elif action == "add instances to":
            frame = self._dynamic_mi(action, name)
            reason = self._vm.add_refusal(name, frame, len(items or ()))
            if reason is not None:
                raise SignalRejected.refused(self.case_id, f"{action} {name!r}", reason, self._path(frame))
        elif action == "close instances of":
            self._dynamic_mi(action, name)
        else:
            self._activations(action, name)

    def cancel_region(self, name: str) -> None:
        """Withdraw all work of every live activation of region `name` (scope or named mi).

        An activation whose thread already went on (a scope the thread left while a discriminator's loser
        still runs inside, an mi whose join fired) only loses that leftover work: what follows it does
        not run again, and `on_cancel` does not run.
        """
        self._vm.cancel_region(name, self._activations("cancel region", name))

    def complete_region(self, name: str) -> None:
        """Close region `name` now: an MI joins with the outputs so far; a scope continues after itself.

        Every live activation is checked before any is touched, so a refused call changes nothing.
        """
        action = "complete region"
        acts = self._activations(action, name)
        refused = self._vm.complete_refusal(name, acts)
        if refused is not None:
            raise SignalRejected.refused(self.case_id, f"{action} {name!r}", refused[1], self._path(refused[0]))
        self._vm.complete_region(name, acts)

    def add_instances(self, name: str, items: Sequence[Any]) -> None:
        """Add one instance per item to the live dynamic MI `name` (WCP15)."""
        if isinstance(items, str | bytes) or not isinstance(items, Sequence):
            raise TypeError(f"add_instances takes a sequence of items (e.g. a list), got {type(items).__name__}")
        action = "add instances to"
        frame = self._dynamic_mi(action, name)
        reason = self._vm.add_refusal(name, frame, len(items))
        if reason is not None:
            raise SignalRejected.refused(self.case_id, f"{action} {name!r}", reason, self._path(frame))
        self._vm.add_instances(frame, list(items))

    def close_instances(self, name: str) -> None:
        """No more instances may be added to the dynamic MI `name`."""
        self._vm.close_instances(self._dynamic_mi("close instances of", name))

    # -- checks ------------------------------------------------------------------------------------------

    def _check_open(self, action: str) -> None:
        vm = self._vm
        if vm.ended:
            raise SignalRejected.ended(self.case_id, action, vm.status, vm.program.root_path)

    def _path(self, frame: Frame) -> str:
        return self._vm.paths[frame.ip]

    def _activations(self, action: str, name: str) -> list[Frame]:
        self.check_region(action, name)
        acts = self._vm.live_activations(name)
        if not acts:
            raise SignalRejected.inactive_region(
                self.case_id, f"{action} {name!r}", name, ", ".join(self._vm.program.region_paths[name])
            )
        return acts

    def _dynamic_mi(self, action: str, name: str) -> MIFrame:
        acts = self._activations(action, name)
        reason = self._vm.dynamic_mi_refusal(name, acts)
        if reason is not None:
            raise SignalRejected.refused(self.case_id, f"{action} {name!r}", reason, self._path(acts[0]))
        frame = acts[0]
        assert isinstance(frame, MIFrame)
        return frame

    # -- snapshots ---------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data (JSON-able when the case data is)."""
        return take(self._vm)

    @classmethod
    def restore(cls, program: Program, snapshot: Mapping[str, Any], *, case_id: str | None = None) -> Machine:
        """A machine that continues exactly where the snapshot's left off."""
        machine = cls.__new__(cls)
        machine.case_id = case_id
        machine._vm = give(program, snapshot)
        return machine

    def __repr__(self) -> str:
        label = f" {self.case_id!r}" if self.case_id is not None else ""
        return f"<Machine{label} {self._vm.status} steps={self._vm.steps}>"


def _encoded(pairs: Sequence[Any]) -> str:
    return json.dumps(pairs, sort_keys=True, separators=(",", ":"), default=repr)


def _fold(vm: Interp, outputs: list[Any]) -> None:
    """Encode and hash the raw (ip, output) pairs of a durable case for its digest now, into the FoldedOutputs at
    the list's head: a case that runs a million tasks between two records encodes and hashes them a burst at a
    time, not all at once when the record is made (the event loop would wait for it). Raw pairs are kept few (one
    tuple each, alive until folded: many would wake the cyclic collector)."""
    head = outputs[0]
    if type(head) is FoldedOutputs:
        raw = outputs[1:]
    else:
        raw, head = outputs[:], FoldedOutputs()
    head.pieces.append(_encoded(raw)[1:-1])
    _runs(head.runs, raw)
    outputs[:] = [head]  # (in place: the hot loop's `outputs` is this list)
    _hasher(vm, head)


def _hasher(vm: Interp, head: FoldedOutputs) -> Any:
    """A blake2b fed the digest so far, "[" and the folded pieces joined by ",": the digest's hash without its
    end. Kept on the vm between bursts and fed each new piece; a snapshot does not hold it (a restored case makes
    it again from the pieces, once)."""
    state = vm.digest_hasher
    if state is not None and state[0] is head:
        _, h, fed = state
    else:
        h, fed = hashlib.blake2b(vm.digest.encode(), digest_size=8), 0
    for piece in head.pieces[fed:]:
        h.update(("," if fed else "[").encode() + piece.encode())
        fed += 1
    vm.digest_hasher = (head, h, fed)
    return h


def _runs(runs: list[int], pairs: Sequence[Any]) -> list[int]:
    """Append the instructions of (ip, output) pairs to `runs` ([ip, count, ...], run-length encoded); return it."""
    last = runs[-2] if runs else -1
    for ip, _ in pairs:
        if ip == last:
            runs[-1] += 1
        else:
            runs += (ip, 1)
            last = ip
    return runs


class _Paths(Sequence[str]):
    """The node paths of the tasks a digest covers, made when read (only a replay's divergence reads them);
    `names` gives each task's name beside."""

    __slots__ = ("_paths", "_runs", "_ips", "_labels")

    def __init__(self, paths: Sequence[str], runs: list[int], labels: Sequence[str] = ()) -> None:
        self._paths = paths
        self._runs = runs
        self._ips: list[int] | None = None
        self._labels = labels

    @property
    def names(self) -> list[str]:
        """Each task's name (its `name=`, else its function's), in the order of the paths ("" where unknown)."""
        labels = self._labels
        return [labels[ip] if ip < len(labels) else "" for ip in self.ips]

    @property
    def ips(self) -> list[int]:
        ips = self._ips
        if ips is None:
            runs = self._runs
            ips = self._ips = [ip for i in range(0, len(runs), 2) for ip in (runs[i],) * runs[i + 1]]
        return ips

    def __len__(self) -> int:
        return sum(self._runs[1::2])

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self._paths[ip] for ip in self.ips[index]]
        return self._paths[self.ips[index]]

    def __eq__(self, other: object) -> bool:
        return list(self) == (list(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"trace level must be one of {', '.join(LEVELS)}, got {level!r}")


def _still_live(
    made: list[_R], cancels: list[int], live: Mapping[int, Token], key: Callable[[_R], int]
) -> tuple[list[_R], list[int]]:
    """Requests made this burst that are still live, and the cancels of requests made in earlier bursts."""
    if not cancels:
        return made, cancels
    ids = {key(r) for r in made}
    return [r for r in made if key(r) in live], [i for i in cancels if i not in ids]

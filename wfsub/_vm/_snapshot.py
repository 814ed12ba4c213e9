"""Snapshot and restore: the machine's whole state as plain, JSON-able data.

The state is a graph of records (tokens, frames, events) plus containers. It is written as a table of
objects, each record once, with references between them (`{"$ref": n}`); program constants are written as
their slot in the constant table (`{"$const": n}`), the root data view as `{"$root": 1}`. Containers that
JSON lacks are tagged (`$tuple`, `$dict` with its key/value pairs, `$deque`, `$set`). Restore rebuilds the
graph against the same program, refusing one whose fingerprint differs. Every subclass of `Record` is a
record class (`record_classes()`), so a new frame class needs no registration here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .._errors import MachineStateError, RestoredError, SnapshotMismatch
from .._program import Program
from ._events import VmEvent
from ._interp import Interp
from ._records import Record, record_classes
from ._result import RunStatus
from ._schedulers import scheduler_from_state

SNAPSHOT_FORMAT = 1
_RECORDS = record_classes()
_STATE = (
    "data",
    "status",
    "ended",
    "root_ended",
    "steps",
    "next_tid",
    "next_eid",
    "next_timer",
    "next_wid",
    "signal_seq",
    "started",
    "cancelling",
    "failing",
    "failure_record",
    "compensated",
    "blocking",
    "outputs",
    "digest",
    "max_instances",
    "awaiting",
    "event_seq",
    "events",
    "ready",
    "root",
    "effects",
    "timers",
    "timer_values",
    "waiters",
    "buffered",
    "updates",
    "regions",
    "locks",
    "lock_waiters",
    "ms_active",
    "ms_waiters",
    "out_cancel_effects",
    "out_cancel_timers",
)


_ADDED: dict[str, Any] = {"timer_values": dict, "compensated": tuple, "updates": lambda: None}
"""State added after the snapshot format's first release: an older snapshot lacks it and gets this empty value."""


def _slots(cls: type) -> list[str]:
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for name in getattr(klass, "__slots__", ()):
            if name not in names:
                names.append(name)
    return names


class _Encoder:
    def __init__(self, machine: Interp) -> None:
        self.root_env = machine.root_env
        self.consts = {id(c): i for i, c in enumerate(machine.program.consts) if c is not None}
        self.ids: dict[int, int] = {}
        self.objects: list[dict[str, Any] | None] = []
        self.todo: list[Any] = []

    def enc(self, v: Any) -> Any:
        if v is None or isinstance(v, bool | int | float | str):
            return v
        if v is self.root_env:
            return {"$root": 1}
        cls = type(v)
        if cls is VmEvent:
            return {"$event": [v[0], v[1], v[2], self.enc(v[3])]}
        if isinstance(v, BaseException):
            name = v.type_name if isinstance(v, RestoredError) else type(v).__name__
            return {"$error": [name, v.message if isinstance(v, RestoredError) else str(v)]}
        if isinstance(v, Record):
            ref = self.ids.get(id(v))
            if ref is None:
                ref = self.ids[id(v)] = len(self.objects)
                self.objects.append(None)
                self.todo.append(v)
            return {"$ref": ref}
        slot = self.consts.get(id(v))
        if slot is not None:
            return {"$const": slot}
        if cls is list:
            return [self.enc(x) for x in v]
        if cls is tuple:
            return {"$tuple": [self.enc(x) for x in v]}
        if cls is deque:
            return {"$deque": [self.enc(x) for x in v]}
        if cls is set or cls is frozenset:
            return {"$set": sorted((self.enc(x) for x in v), key=repr)}
        if isinstance(v, Mapping):
            return {"$dict": [[self.enc(k), self.enc(x)] for k, x in v.items()]}
        return v  # user data of another type: kept as is (not JSON-able; the caller's choice)

    def drain(self) -> None:
        while self.todo:
            obj = self.todo.pop()
            fields = {name: self.enc(getattr(obj, name)) for name in _slots(type(obj)) if hasattr(obj, name)}
            self.objects[self.ids[id(obj)]] = {"type": type(obj).__name__, "fields": fields}


def take(machine: Interp) -> dict[str, Any]:
    e = _Encoder(machine)
    state = {name: e.enc(getattr(machine, name)) for name in _STATE}
    e.drain()
    error = None if machine.error is None else e.enc(machine.error)
    return {
        "format": SNAPSHOT_FORMAT,
        "fingerprint": machine.program.fingerprint,
        "trace_level": machine.trace_level,
        "scheduler": machine.scheduler.to_state(),
        "error": error,
        "error_path": machine.error_path,
        "error_message": machine.error_message,
        "state": state,
        "objects": e.objects,
    }


def give(program: Program, snap: Mapping[str, Any]) -> Interp:
    if not isinstance(snap, Mapping) or snap.get("format") != SNAPSHOT_FORMAT:
        raise MachineStateError("not a wfsub machine snapshot (missing or unknown 'format')")
    if snap.get("fingerprint") != program.fingerprint:
        raise SnapshotMismatch(
            f"snapshot is of program {str(snap.get('fingerprint'))[:16]}, not {program.fingerprint[:16]}: "
            "restore it with the workflow (and library) it was taken from"
        )
    machine = Interp.__new__(Interp)
    machine.attach(program)
    records: list[Any] = []
    for spec in snap["objects"]:
        cls = _RECORDS.get(spec["type"])
        if cls is None:
            raise MachineStateError(f"unknown record type {spec['type']!r} in snapshot")
        records.append(cls.__new__(cls))
    data: dict[str, Any] = {}
    root_env = MappingProxyType(data)
    consts = program.consts

    def dec(v: Any) -> Any:
        if isinstance(v, list):
            return [dec(x) for x in v]
        if not isinstance(v, dict):
            return v
        if "$ref" in v:
            return records[v["$ref"]]
        if "$const" in v:
            return consts[v["$const"]]
        if "$root" in v:
            return root_env
        if "$error" in v:
            return RestoredError(*v["$error"])
        if "$event" in v:
            seq, kind, path, detail = v["$event"]
            return VmEvent((seq, kind, path, dec(detail)))
        if "$tuple" in v:
            return tuple(dec(x) for x in v["$tuple"])
        if "$deque" in v:
            return deque(dec(x) for x in v["$deque"])
        if "$set" in v:
            return {dec(x) for x in v["$set"]}
        if "$dict" in v:
            return {dec(k): dec(x) for k, x in v["$dict"]}
        raise MachineStateError(f"malformed snapshot value {v!r}")

    for obj, spec in zip(records, snap["objects"], strict=True):
        for name, value in spec["fields"].items():
            object.__setattr__(obj, name, dec(value))
    state = snap["state"]
    data.update(dec(state["data"]))
    machine.data = data
    machine.root_env = root_env
    for name in _STATE:
        if name != "data":
            setattr(machine, name, dec(state[name]) if name in state else _ADDED[name]())
    machine.status = RunStatus(machine.status)
    machine.trace_level = snap["trace_level"]
    machine.scheduler = scheduler_from_state(snap["scheduler"])
    machine.error_path = snap["error_path"]
    machine.error_message = snap["error_message"]
    machine.error = None if snap["error"] is None else dec(snap["error"])
    machine.out_effects = []
    machine.out_timers = []
    machine.closing = None
    machine.withdrawing = None
    machine.gc_paused = False
    machine.digest_hasher = None  # (made again from the folded outputs when needed)
    machine.workflow = None  # named only by `case_started`, long since emitted
    return machine

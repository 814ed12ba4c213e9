"""What the chaos campaign's nodes run: the workflows, the plan of cases and client calls a seed gives, and the
effects' log lines (importable by the node processes and by the campaign alike).

Every effect prints one JSON line when an attempt starts, before it does anything:

    {"ev": "effect", "case": ..., "key": idempotency key, "name": ..., "attempt": n, "node": node id, "pid": ...,
     "lease": {"seconds": L, "since_sent": s, "since_done": d, "renewals": k} | null}

`lease` is the node's own view of its lease when the attempt starts: `since_sent` is the time (on the node's
monotonic clock) since the node sent the last lease renewal that succeeded, `since_done` since that renewal's
answer came back. The renewal set the lease's expiry to the database's time when it ran plus L, and it ran after
it was sent: so while `since_sent <= L` the lease certainly holds, and past it the node cannot know (the checker
calls that "in doubt"). SQLite owners hold no lease (null).

The lines go to the process's stdout, a pipe the campaign reads: a pipe is not a file, so a node under a file
size limit (disk full) still logs.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio

from wfsub import effect, effect_info, mi, saga, seq, sleep, wait
from wfsub.stores import PostgresStore

_out_lock = threading.Lock()


def emit(**line: Any) -> None:
    """One JSON line to stdout in one write (atomic on a pipe: shorter than PIPE_BUF)."""
    data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
    with _out_lock:
        os.write(sys.stdout.fileno(), data)


class LeaseView:
    """A node's own view of its lease: when its last successful renewal was sent and answered (monotonic)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.sent: float | None = None
        self.done: float | None = None
        self.renewals = 0

    def renewed(self, sent: float) -> None:
        self.sent, self.done = sent, time.monotonic()
        self.renewals += 1

    def now(self) -> dict[str, Any]:
        mono = time.monotonic()
        return {
            "seconds": self.seconds,
            "since_sent": None if self.sent is None else round(mono - self.sent, 4),
            "since_done": None if self.done is None else round(mono - self.done, 4),
            "renewals": self.renewals,
        }


class WatchedStore(PostgresStore):
    """The Postgres store, noting each lease renewal that succeeded (opening takes the lease too) in a LeaseView."""

    def __init__(self, dsn: str, view: LeaseView, **options: Any) -> None:
        super().__init__(dsn, **options)
        self.view = view

    async def open(self, *, owner: bool, owner_id: str) -> None:
        sent = time.monotonic()
        await super().open(owner=owner, owner_id=owner_id)
        if owner:
            self.view.renewed(sent)

    async def renew_lease(self) -> float:
        sent = time.monotonic()
        now = await super().renew_lease()
        self.view.renewed(sent)
        return now


class _Node:
    id = "?"
    view: LeaseView | None = None


NODE = _Node()  # set by the node process before its Substrate opens


async def step(ctx: Mapping[str, Any]) -> dict[str, Any]:
    """An effect: logs its attempt, takes a little time (so faults land inside effects), answers."""
    info = effect_info()
    emit(ev="effect", case=info.case_id, key=info.idempotency_key, name=info.name, attempt=info.attempt,
         node=NODE.id, pid=os.getpid(), t=round(time.time(), 4),
         lease=None if NODE.view is None else NODE.view.now())
    digest = hashlib.sha256(f"{info.idempotency_key}/{info.attempt}".encode()).digest()
    await anyio.sleep(0.02 + digest[0] / 255 * 0.3)
    return {f"did_{info.name}": True}


def _items(ctx: Mapping[str, Any]) -> list[Any]:
    return list(ctx["items"])


ORDER = seq(
    effect(step, name="check"),
    saga(
        (effect(step, name="reserve"), effect(step, name="release")),
        (effect(step, name="charge"), effect(step, name="refund")),
        wait("approve"),
    ),
    effect(step, name="ship"),
)
TIMED = seq(effect(step, name="prepare"), sleep(1.5), wait("go"), effect(step, name="send"), sleep(1.0),
            effect(step, name="confirm"))
BATCH = seq(mi(effect(step, name="item"), items=_items, collect="results"), wait("go"), effect(step, name="total"))
FLOWS = {"order": ORDER, "timed": TIMED, "batch": BATCH}


@dataclass
class Op:
    """A client call the plan makes once the case waits for `name`: a signal, or a cancel of the case."""

    kind: str  # signal | cancel
    name: str  # the signal the case must be waiting for before the call
    request_id: str


@dataclass
class CaseSpec:
    case_id: str
    workflow: str
    data: dict[str, Any]
    at: float  # seconds into the run when its starter starts it
    starter: int  # the index of the process that starts it
    sender: int  # the index of the process that makes its calls
    ops: list[Op] = field(default_factory=list)
    expect: str = "done"  # the state it must end in

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> CaseSpec:
        return cls(**{**raw, "ops": [Op(**op) for op in raw["ops"]]})


def plan(seed: int, prefix: str, count: int, processes: int, spread: float) -> list[CaseSpec]:
    """`count` cases started over `spread` seconds: process i starts cases i, i+n, ...; the next one sends to them."""
    rng = random.Random(f"{seed}/{prefix}")
    cases = []
    for i in range(count):
        case_id = f"{prefix}{i}"
        workflow = rng.choice(["order", "order", "timed", "batch"])
        data: dict[str, Any] = {"n": i}
        if workflow == "batch":
            data["items"] = list(range(rng.randint(2, 4)))
        spec = CaseSpec(case_id, workflow, data, at=round(i * spread / max(count, 1), 3), starter=i % processes,
                        sender=(i + 1) % processes)
        if workflow == "order" and rng.random() < 0.3:
            spec.ops.append(Op("cancel", "approve", f"{case_id}:cancel"))
            spec.expect = "cancelled"
        else:
            name = "approve" if workflow == "order" else "go"
            spec.ops.append(Op("signal", name, f"{case_id}:{name}"))
        cases.append(spec)
    return cases

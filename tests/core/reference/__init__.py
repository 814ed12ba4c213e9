"""A reference interpreter that walks terms directly, for differential tests against the compiled vm.

It shares nothing with the vm but the term classes and tree helpers of `wfsub._terms`, so a semantic bug in
the vm shows up as a disagreement. It covers every construct but `net` (`start_case` and `signal_case` as the
effects they are to a case: what they do to other cases is the runtime's, tested there), and the inputs a
driver gives a case: effect outcomes, timer firings, signals, `cancel` (with or without compensation) and the
region operations.

Modules: `_blocks` (the activation tree: blocks and threads), `_engine` (stepping the constructs, joins, mi),
`_undo` (withdrawal, compensation, failures and cancels); this module is the front a test drives.

The rules are the documented ones (docs/guide/semantics.md); where the docs leave a choice open, the
reference follows the vm and says so here:
- Scheduling: see `_engine`. Handlers of withdrawn work start innermost first; among siblings, the one that
  joined its block last starts first (the docs call siblings concurrent).
- A join fired by the withdrawal of its last running branch starts a new thread at the back of the queue.
- An instance's output is `{}` when it completed without writing anything.
- `complete_region` on an mi withdraws every running instance (whatever `cancel_remaining` says) and starts no
  compensation; compensations already running go on as detached work.
- A deadlock (nothing pending, threads waiting for a lock, a milestone or a blocking par) fails the case at the
  node of the first such waiter.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from wfsub._terms import Defer, Sleep, Term, Wait, child_path

from . import _updates
from ._blocks import MIBlock
from ._engine import Engine, Failure

__all__ = ["Outcome", "Reference", "Rejected"]


class Rejected(Exception):
    """An input the case cannot take now (the vm raises a WfsubError for it and changes nothing)."""


Outcome = tuple[str, str | None, str | None]
"""(status, error type, error node path); status is running, done, failed or cancelled."""


class Reference:
    """One case, driven like a `Machine`: `run()` until nothing can move, then one input, then `run()` again."""

    def __init__(self, term: Term, data: Mapping[str, Any] | None = None, *,
                 library: Mapping[str, Term] | None = None) -> None:
        self.e = Engine(term, data, library)

    @property
    def data(self) -> dict[str, Any]:
        return self.e.data

    def run(self) -> dict[str, Any]:
        self.e.run()
        return self.e.data

    def outcome(self) -> Outcome:
        err = self.e.error
        return (self.e.status, err[0] if err else None, err[1] if err else None)

    def effects(self) -> dict[int, str]:
        """Effects in flight: id -> node path."""
        return {eid: th.at[1] for eid, th in self.e.effects.items()}

    def timers(self) -> list[int]:
        return sorted(self.e.timers)

    def timer_lengths(self) -> dict[int, tuple[float, float | None]]:
        """Armed timers: id -> (seconds, epoch due or None), as computed when their step started."""
        return {tid: self.e.lengths[tid] for tid in self.e.timers}

    def awaited(self) -> list[str]:
        return self.e.awaited() if self.e.status == "running" else []

    # -- inputs ----------------------------------------------------------------------------------------

    def _open(self) -> None:
        if self.e.status != "running":
            raise Rejected("the case has ended")

    def update(self, name: str, payload: Any, uid: str) -> None:
        """An update: as a signal, with an id its answer comes back under (in `answers`)."""
        self._open()
        if name not in self.e.updates:
            raise Rejected(f"no wait or reply answers {name!r}")
        self.signal(name, payload, uid)

    def signal(self, name: str, payload: Any = None, uid: str | None = None) -> None:
        e = self.e
        self._open()
        if name not in e.signals:
            raise Rejected(f"no wait or defer takes {name!r}")
        q = e.waiters.get(name)
        while q:
            th, wid = q.popleft()
            if e.waiting(th, "signal", wid):
                refusal = e.check(th.at[0], name, th.env, payload)
                if refusal is not None:  # the waiting thread's check= says no: it goes on waiting, nothing changes
                    q.appendleft((th, wid))
                    raise Rejected(refusal)
                t, path = th.at
                self._wake(th, name, payload)
                if uid is not None:
                    _updates.took(e, th, t, path, name, uid)
                return
        if name in e.persistent:
            e.arrivals += 1
            e.buffered.setdefault(name, deque()).append((e.arrivals, payload))
            if uid is not None:
                e.buffer_ids[e.arrivals] = uid
        elif uid is not None:  # nobody takes it: answered None
            e.answers.append((uid, "answer", name, None))

    def _wake(self, th: Any, name: str, payload: Any) -> None:
        e = self.e
        th.park = ""
        if th.timeout:
            e.timers.pop(th.timeout, None)
            th.timeout = 0
        t, path = th.at
        if isinstance(t, Wait):
            e.store(th.env, {t.into or t.signal: payload})
        else:
            e.store(th.env, {name: payload})
            branch = dict(t.branches)[name]
            th.stack.append((branch, child_path(path, name, branch)))
        e.ready.append(th)

    def complete_effect(self, effect_id: int, output: Mapping[str, Any] | None = None, *,
                        error: BaseException | None = None) -> bool:
        e = self.e
        if not 0 < effect_id < e.next_effect:
            raise Rejected(f"unknown effect id {effect_id}")
        if e.status != "running":
            return False
        th = e.effects.pop(effect_id, None)
        if th is None:
            return False
        path = th.at[1]
        if error is not None:
            e.fail(th.block, type(error).__name__, path, str(error))
            return True
        try:
            e.merge(th, output, path)
        except Failure as f:
            e.fail(th.block, f.type_name, f.path, f.message)
            return True
        th.park = ""
        e.ready.append(th)
        return True

    def fire_timer(self, timer_id: int) -> bool:
        e = self.e
        if not 0 < timer_id < e.next_timer:
            raise Rejected(f"unknown timer id {timer_id}")
        th = e.timers.pop(timer_id, None)
        if th is None:
            return False
        t, path = th.at
        if isinstance(t, Sleep):
            th.park = ""
        elif isinstance(t, Wait):  # nothing arrived in time: a failure at the wait
            th.park = ""
            th.timeout = 0
            e.fail(th.block, "WaitTimeout", path, "wait timed out")
            return True
        else:
            assert isinstance(t, Defer)
            th.park = ""
            th.timeout = 0
            th.stack.append((t.on_timeout, child_path(path, "timeout", t.on_timeout)))
        e.ready.append(th)
        return True

    def cancel(self, *, compensate: bool = True) -> None:
        self._open()
        self.e.cancel_case(compensate)

    def _activations(self, name: str) -> list[Any]:
        self._open()
        if name not in self.e.region_names:
            raise Rejected(f"unknown region {name!r}")
        acts = [b for b in self.e.regions.get(name, []) if b.alive]
        if not acts:
            raise Rejected(f"region {name!r} is not active")
        return acts

    def cancel_region(self, name: str) -> None:
        self.e.cancel_region(self._activations(name))

    def complete_region(self, name: str) -> None:
        acts = self._activations(name)
        if self.e.complete_refused(acts):
            raise Rejected(f"mi {name!r} has already joined")
        self.e.complete_region(acts)

    def _dynamic(self, name: str) -> MIBlock:
        acts = self._activations(name)
        if self.e.dynamic_refused(acts):
            raise Rejected(f"region {name!r} takes no instances")
        block = acts[0]
        assert isinstance(block, MIBlock)
        return block

    def add_instances(self, name: str, items: Sequence[Any]) -> None:
        block = self._dynamic(name)
        if block.term.max is not None and block.started + len(items) > block.term.max:
            raise Rejected(f"mi {name!r} allows at most max={block.term.max} instances")
        self.e.add_instances(block, list(items))

    def close_instances(self, name: str) -> None:
        self.e.close_instances(self._dynamic(name))

"""Drive a vm Machine by hand for the pattern tests: run to quiescence, complete effects by name, fire timers.

`Case` wraps a Machine and keeps the bookkeeping a runtime would keep: the effects in flight and the timers
armed (both minus what the vm asked to cancel), and every effect and timer id the vm cancelled so far.
Inputs go straight to `case.m` (or through the shortcuts here); `case.run()` then runs until the machine is
blocked or has ended and returns the merged RunResult of those runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import wfsub
from wfsub import Term, effect, task
from wfsub.lowlevel import EffectRequest, Machine, RunResult, Scheduler, TimerRequest

MAX_RUNS = 1000  # a test that needs more runs than this is looping


def step(log: list[str], name: str, **updates: Any) -> Term:
    """A task named `name` that appends `name` to `log` and returns `updates` (or None when there are none)."""

    def fn(ctx: Mapping[str, Any]) -> dict[str, Any] | None:
        log.append(name)
        return dict(updates) if updates else None

    fn.__name__ = fn.__qualname__ = name
    return task(fn, name=name)


def call_task(log: list[str], name: str, fn: Callable[[Mapping[str, Any]], Any]) -> Term:
    """A task named `name` that appends `name` to `log` and returns `fn(ctx)`."""

    def run(ctx: Mapping[str, Any]) -> Any:
        log.append(name)
        return fn(ctx)

    run.__name__ = run.__qualname__ = name
    return task(run, name=name)


async def _never_called(ctx: Mapping[str, Any]) -> None:  # the vm never calls effects: the test completes them
    raise AssertionError("effects are completed by the test, not run")


def fx(name: str) -> Term:
    """An effect named `name`; a test completes it with `Case.complete(name, ...)`."""
    return effect(_never_called, name=name)


class Case:
    """One Machine and the driver state around it."""

    def __init__(
        self,
        term: Term,
        data: Mapping[str, Any] | None = None,
        *,
        library: Mapping[str, Term] | None = None,
        scheduler: Scheduler | None = None,
        trace_level: str = "none",
        quanta: int = 1000,
        max_call_depth: int | None = None,
    ) -> None:
        depth = {} if max_call_depth is None else {"max_call_depth": max_call_depth}
        program = wfsub.compile(term, library=library, **depth)
        self.m = Machine(program, data, scheduler=scheduler, trace_level=trace_level)
        self.quanta = quanta
        self.pending: dict[int, EffectRequest] = {}
        self.armed: dict[int, TimerRequest] = {}
        self.cancelled_effects: list[int] = []
        self.cancelled_timers: list[int] = []

    @property
    def data(self) -> dict[str, Any]:
        return self.m.data

    def run(self) -> RunResult:
        """Run until the machine is blocked or ended; the merged result of every run() this took."""
        merged = RunResult("yielded", 0)
        for _ in range(MAX_RUNS):
            r = self.m.run(self.quanta)
            merged.steps += r.steps
            merged.effects += r.effects
            merged.timers += r.timers
            merged.cancelled_effects += r.cancelled_effects
            merged.cancelled_timers += r.cancelled_timers
            merged.status, merged.signals = r.status, r.signals
            merged.error, merged.error_path, merged.error_message = r.error, r.error_path, r.error_message
            if r.status != "yielded":
                break
        else:
            raise AssertionError(f"still yielding after {MAX_RUNS} runs")
        self.pending.update((req.effect_id, req) for req in merged.effects)
        self.armed.update((timer.timer_id, timer) for timer in merged.timers)
        for eid in merged.cancelled_effects:
            self.pending.pop(eid, None)
        for tid in merged.cancelled_timers:
            self.armed.pop(tid, None)
        self.cancelled_effects += merged.cancelled_effects
        self.cancelled_timers += merged.cancelled_timers
        return merged

    # -- effects -----------------------------------------------------------------------------------

    def effect_ids(self, name: str) -> list[int]:
        """Ids of the pending effects whose name (or node path) is `name`, oldest first."""
        return sorted(eid for eid, req in self.pending.items() if name in (req.name, req.path))

    def effect_id(self, name: str) -> int:
        """The id of the one pending effect named `name`."""
        ids = self.effect_ids(name)
        assert len(ids) == 1, f"expected one pending effect {name!r}, found ids {ids} in {self.pending_names()}"
        return ids[0]

    def pending_names(self) -> list[str]:
        """Names of the pending effects, in request order."""
        return [self.pending[eid].name for eid in sorted(self.pending)]

    def complete(self, name_or_id: str | int, output: Mapping[str, Any] | None = None) -> RunResult:
        """Complete one pending effect (by name, path or id), assert the vm accepted it, and run."""
        eid = name_or_id if isinstance(name_or_id, int) else self.effect_id(name_or_id)
        self.pending.pop(eid, None)
        accepted = self.m.complete_effect(eid, output)
        assert accepted, f"effect {name_or_id!r} (id {eid}) was discarded"
        return self.run()

    # -- timers and signals ------------------------------------------------------------------------

    def fire(self, timer_id: int) -> RunResult:
        """Fire an armed timer, assert the vm accepted it, and run."""
        self.armed.pop(timer_id, None)
        assert self.m.fire_timer(timer_id), f"timer {timer_id} was stale"
        return self.run()

    def signal(self, name: str, payload: Any = None) -> RunResult:
        """Deliver a signal and run."""
        self.m.deliver_signal(name, payload)
        return self.run()

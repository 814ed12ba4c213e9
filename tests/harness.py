"""The one vocabulary of the pattern and runtime tests: recorded steps and effects, driven by hand on the vm
(`Case`) or run for real by a Substrate on a virtual clock (`running`).

    rec = Recorder()                                  # rec.steps, rec.calls, rec.cancelled: what ran
    term = seq(rec.step("a", {"x": 1}), rec.effect("charge"), rec.step("b"))

    case = Case(term)                                 # vm level: nothing runs an effect, the test completes it
    case.run()
    case.complete("charge", {"paid": True})
    assert (rec.steps, case.data) == (["a", "b"], {"x": 1, "paid": True})

    async with running() as (sub, clock, sink):       # runtime level: the Substrate calls the effects
        rec = Recorder(clock)                         # the clock lets an effect take `delay` seconds
        handle = await sub.new_case(seq(rec.step("a"), rec.effect("charge", delay=1)))
        await clock.advance(1)
        assert await handle.result() == {"charge": True}
    assert (rec.steps, rec.calls) == (["a"], ["charge"])

`trace_of(events, *kinds)` reads a trace the same way at both levels: `case.events` (the vm's) or
`sink.for_case(case_id)` (the runtime's).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple, Protocol

import anyio

import wfsub
from wfsub import Retry, Substrate, Term, effect, task
from wfsub.lowlevel import EffectRequest, Machine, Program, RunResult, Scheduler, TimerRequest, VmEvent
from wfsub.testing import CapturingSink, VirtualClock

__all__ = ["Case", "Output", "Recorder", "Rig", "running", "trace_of"]

MAX_RUNS = 1000  # a Case that needs more runs than this to settle is looping

Output = Mapping[str, Any] | Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None
"""What a recorded step or effect returns: a mapping of updates, a function of ctx giving them, or None."""


def _output(returns: Output, ctx: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if callable(returns):
        return returns(ctx)
    return dict(returns) if returns is not None else None


# -- building steps ------------------------------------------------------------------------------------------


class Recorder:
    """Builds steps and effects named `name` that record what they did, for tests at either level.

    - `steps`: names of the tasks built by `step` that ran, in order (the vm runs them at both levels);
    - `calls`: names of the effects built by `effect` that were called, in order (only the runtime calls
      effects: at the vm level the test completes them with `Case.complete`, so `calls` stays empty);
    - `cancelled`: names of the effect calls that were cancelled while in flight;
    - `active` / `max_active`: effect calls in flight now / at most at once.
    """

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock
        self.steps: list[str] = []
        self.calls: list[str] = []
        self.cancelled: list[str] = []
        self.active = 0
        self.max_active = 0

    def step(self, name: str, returns: Output = None) -> Term:
        """A task named `name`: appends `name` to `steps` and returns `returns` (nothing by default)."""

        def fn(ctx: Mapping[str, Any]) -> Mapping[str, Any] | None:
            self.steps.append(name)
            return _output(returns, ctx)

        fn.__name__ = fn.__qualname__ = name
        return task(fn, name=name)

    def effect(
        self,
        name: str,
        returns: Output = None,
        *,
        delay: float = 0.0,
        hang: bool = False,
        timeout: float | None = None,
        retry: Retry | None = None,
    ) -> Term:
        """An effect named `name`: when called, appends `name` to `calls`, waits `delay` seconds of the clock
        (or forever with `hang`), then returns `returns` ({name: True} by default); a cancelled call is
        appended to `cancelled`. `timeout` and `retry` are wfsub.effect's."""
        if delay and self.clock is None:
            raise ValueError(f"effect {name!r} has delay={delay}: give the Recorder the clock to wait on")
        clock = self.clock

        async def fn(ctx: Mapping[str, Any]) -> Mapping[str, Any] | None:
            self.calls.append(name)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            try:
                if hang:
                    await anyio.sleep_forever()
                if delay:
                    assert clock is not None
                    await clock.sleep(delay)
            except anyio.get_cancelled_exc_class():
                self.cancelled.append(name)
                raise
            finally:
                self.active -= 1
            return {name: True} if returns is None else _output(returns, ctx)

        fn.__name__ = fn.__qualname__ = name
        return effect(fn, name=name, timeout=timeout, retry=retry)


# -- reading traces --------------------------------------------------------------------------------------------


class _Event(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def detail(self) -> Mapping[str, Any]: ...


def trace_of(events: Iterable[_Event], *kinds: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(kind, path, detail) of each event whose kind is one of `kinds` (of every event when none), in order.

    Takes vm events (`case.events`) and runtime trace events (`sink.for_case(case_id)`) alike.
    """
    return [(e.kind, e.path, dict(e.detail)) for e in events if not kinds or e.kind in kinds]


# -- vm level: a Machine driven by hand ----------------------------------------------------------------------


class Case:
    """One vm Machine and the bookkeeping a runtime would keep around it, driven by the test.

    `run()` runs until the machine is blocked or ended and returns the merged RunResult of those runs; it
    keeps `pending` (effects in flight) and `armed` (timers), both minus what the vm cancelled, and every
    effect and timer id the vm cancelled so far (`cancelled_effects`, `cancelled_timers`). Each input method
    (`complete`, `fire`, `signal`, `cancel_region`, ...) gives one input, then runs and returns that result;
    they are named after the Substrate's methods. `m` is the Machine itself, for several inputs in one burst.
    """

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
        self.program: Program = wfsub.compile(term, library=library, **depth)
        self.m = Machine(self.program, data, scheduler=scheduler, trace_level=trace_level)
        self.quanta = quanta
        self.pending: dict[int, EffectRequest] = {}
        self.armed: dict[int, TimerRequest] = {}
        self.cancelled_effects: list[int] = []
        self.cancelled_timers: list[int] = []
        self._events: list[VmEvent] = []

    @property
    def data(self) -> dict[str, Any]:
        """The case data."""
        return self.m.data

    @property
    def events(self) -> list[VmEvent]:
        """Every trace event the machine emitted so far (record them with trace_level="min" or "full")."""
        self._events += self.m.take_events()
        return self._events

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

    # -- effects ---------------------------------------------------------------------------------------------

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
        """Complete one pending effect (by name, path or id) with `output`, assert the vm accepted it, and run."""
        eid = name_or_id if isinstance(name_or_id, int) else self.effect_id(name_or_id)
        self.pending.pop(eid, None)
        accepted = self.m.complete_effect(eid, output)
        assert accepted, f"effect {name_or_id!r} (id {eid}) was discarded"
        return self.run()

    # -- timers, signals, regions, cancel --------------------------------------------------------------------

    def fire(self, timer_id: int) -> RunResult:
        """Fire an armed timer, assert the vm accepted it, and run."""
        self.armed.pop(timer_id, None)
        assert self.m.fire_timer(timer_id), f"timer {timer_id} was stale"
        return self.run()

    def signal(self, name: str, payload: Any = None) -> RunResult:
        """Deliver a signal and run."""
        self.m.deliver_signal(name, payload)
        return self.run()

    def cancel_region(self, name: str) -> RunResult:
        """Cancel region `name` (a scope or a named mi) and run; raises SignalRejected if the vm refuses."""
        self.m.cancel_region(name)
        return self.run()

    def complete_region(self, name: str) -> RunResult:
        """Complete region `name` and run; raises SignalRejected if the vm refuses."""
        self.m.complete_region(name)
        return self.run()

    def add_instances(self, name: str, items: Sequence[Any]) -> RunResult:
        """Add one instance per item to the dynamic mi `name` and run; raises SignalRejected if refused."""
        self.m.add_instances(name, items)
        return self.run()

    def close_instances(self, name: str) -> RunResult:
        """Close the dynamic mi `name` to more instances and run; raises SignalRejected if refused."""
        self.m.close_instances(name)
        return self.run()

    def cancel(self, *, compensate: bool = True) -> RunResult:
        """Cancel the whole case and run; raises SignalRejected if it has ended."""
        self.m.cancel(compensate=compensate)
        return self.run()


# -- runtime level: a Substrate on a virtual clock ------------------------------------------------------------


class Rig(NamedTuple):
    """What `running()` yields: unpack it as `(sub, clock, sink)`."""

    sub: Substrate
    clock: VirtualClock
    sink: CapturingSink


@asynccontextmanager
async def running(**options: Any) -> AsyncIterator[Rig]:
    """A Substrate(**options) on a fresh VirtualClock, tracing to a CapturingSink unless `sinks=` is given;
    opened in the test's own task, so no fixture is needed (and it works on trio too)."""
    clock = VirtualClock()
    sink = CapturingSink()
    options.setdefault("sinks", [sink])
    async with Substrate(clock=clock, **options) as sub:
        yield Rig(sub, clock, sink)

"""Trace levels and the event kinds the vm emits.

The vm owns this vocabulary: it appends plain `VmEvent` records (no clock, no pydantic on the hot path); the
runtime stamps them with the case id and a time, and `wfsub._trace` turns them into `TraceEvent` models at the
edge.

Levels:
- `none`: nothing is recorded; the vm runs its untraced loop and pays nothing per step.
- `min`: lifecycle, tasks, joins, MI, nets, signals, effects, timers, cancels (the kinds in `MIN_KINDS`).
- `full`: `min` plus one `step` event per instruction and one `schedule` event per scheduler choice.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Literal

TraceLevel = Literal["none", "min", "full"]
LEVELS: dict[str, int] = {"none": 0, "min": 1, "full": 2}

MIN_KINDS: frozenset[str] = frozenset(
    {
        "case_started",  # the machine was created; detail: workflow (a registered name)
        "case_resumed",  # a durable case brought back into memory (the runtime); path: the root; detail: workflow
        "case_left",  # a durable case left memory (the runtime): evicted while parked, or fenced; detail: why
        "case_done",  # the case ended as done
        "case_failed",  # detail: error, path
        "case_cancelled",  # detail: reason
        "task",  # a task ran; detail: name
        "choice",  # xor / multi_choice picked branches; detail: branches
        "split",  # par / multi_choice started branches; detail: branches
        "join",  # a join fired; detail: arrived, policy
        "join_late",  # a branch arrived after its join had fired (ignored: WCP9/30)
        "withdrawn",  # a branch or region stopped without arriving; detail: reason
        "loop",  # a loop started another iteration; detail: iteration
        "effect_requested",  # detail: effect_id, name
        "effect_completed",  # detail: effect_id
        "effect_failed",  # detail: effect_id, error
        "effect_discarded",  # a result arrived for a withdrawn token; detail: effect_id
        "effect_cancelled",  # an in-flight effect was withdrawn; detail: effect_id
        "effect_retry",  # an attempt failed and will be retried; detail: effect_id, attempt, delay, type, error
        "timer_armed",  # detail: timer_id, seconds (sleep(until=): at, the epoch due)
        "timer_fired",  # detail: timer_id
        "timer_cancelled",  # detail: timer_id
        "timer_stale",  # a firing arrived for a withdrawn timer; detail: timer_id
        "signal_waiting",  # a token parked on a signal; detail: signal
        "signal_consumed",  # detail: signal
        "signal_buffered",  # nobody waited; kept for a later wait (persistent trigger)
        "signal_dropped",  # nobody waited and every wait on it is transient
        "deferred_choice",  # detail: chosen (signal name or "timeout")
        "region_cancelled",  # detail: region, tokens
        "region_completed",  # detail: region
        "region_inactive",  # a cancel_region/complete_region step found its region not active; detail: region
        "mi_started",  # detail: instances
        "mi_instance_done",  # detail: index
        "mi_instances_added",  # detail: count
        "mi_joined",  # detail: completed, cancelled
        "critical_wait",  # detail: name
        "milestone",  # detail: name, event ("entered" / "left")
        "call",  # detail: name, depth
        "terminated",
        "net_node",  # a net node started; path: the node's (net[name].kind); detail: node
        "net_join",  # an and/or join of a net fired; detail: node, join, edges (the sources it took tokens from)
        "net_discarded",  # tokens left at an and-join when the net could not move; detail: node, tokens per source
        "net_end",  # a token of a net reached end; detail: from
        "failure",  # a failure at a node; detail: type, error
        "error_caught",  # a scope's on_error took a failure; path: the scope's; detail: error, at (where it failed)
        "compensation",  # a compensation or on_cancel branch; detail: name, event ("started" / "done" / "failed")
        "case_cancelling",  # a cancel with compensation began: the case ends once its compensations have run
        "par_blocked",  # a thread re-entering a blocking par waits for the current activation; detail: token
        "mi_closed",  # close_instances: an open or dynamic mi takes no more instances
    }
)
FULL_KINDS: frozenset[str] = MIN_KINDS | {"step", "schedule"}


class VmEvent(tuple[int, str, str, dict[str, Any]]):
    """One thing the vm did: `seq` orders events within a case; `path` is the node path.

    A tuple underneath: the vm makes one per traced step, and a tuple subclass is built by C code, about twice
    as fast as a slots dataclass.
    """

    __slots__ = ()

    seq = property(itemgetter(0), doc="position of the event within its case, from 1")
    kind = property(itemgetter(1), doc="what happened (see MIN_KINDS / FULL_KINDS)")
    path = property(itemgetter(2), doc="node path of the instruction that did it")
    detail = property(itemgetter(3), doc="kind-specific fields")

    def as_tuple(self) -> tuple[int, str, str, dict[str, Any]]:
        return (self[0], self[1], self[2], self[3])

    def __repr__(self) -> str:
        return f"VmEvent(seq={self[0]}, kind={self[1]!r}, path={self[2]!r}, detail={self[3]!r})"

"""`StartRequest`: one start of a case, whichever door it came through (the API's `new_case`, a queue's dequeue,
a schedule's slot, a parent's `start_case`), as the starts room (`_starts`) takes it.

The API door checks what its caller gave and builds one; a queue, a schedule and a child case build theirs from
what was checked when they were made (a dequeued case's start was checked when it was queued), so a check added to
the door runs once, at the door.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from .._terms import Term


@dataclass(frozen=True, slots=True)
class StartRequest:
    """One start of a case (see the module); every field but `workflow` has the API's default."""

    workflow: str | Term  # a registered name, or a term (a Substrate without a store only)
    data: Mapping[str, Any] | BaseModel | None = None
    case_id: str | None = None  # None: a new generated id
    timeout: float | None = None  # seconds from its start to its deadline
    seed: int | None = None  # the scheduler: Seeded(seed), or None for the deterministic one
    placement: str = "here"  # "any": queued for the first node of a shared store that claims it
    tags: Mapping[str, str] | None = None
    queue: str | None = None  # a named queue it waits in until it has room
    priority: int = 0
    dedup: str | None = None
    partition: str | None = None
    delay: float | None = None
    parent: str | None = None  # `start_case`: the case starting this one (see `_children`)
    cancel_with_parent: bool = False  # `start_case`: the parent waits for it and cancels it on withdrawal
    parent_step: Mapping[str, Any] | None = None  # and the parent's step that does ({"effect_id", "path"})
    waited: bool = False  # `start_case(wait=True)`: the parent waits for its end (deleted with the parent)
    sent: Mapping[str, Any] | None = None  # a dequeued start: the data its caller sent (`data`: the model's dump)
    from_queue: bool = False  # the start of a queue item this node claimed (the one start its id may have)
    schedule: str | None = None  # a schedule's slot: refused while that schedule is paused (SchedulePaused)

"""The activation tree of the reference: blocks (one per activation of a construct) and threads (its leaves).

A thread is in exactly one block and carries its own continuation inside it: a stack of `(term, path)` items
and markers. A block that a thread passes through keeps the continuation its thread had outside (`k`), so that
leaving the block resumes it. `threads` counts the children that are threads *of* the block (attached); a child
that its thread left running (a discriminator's losers, an mi without a join) is detached work: it still
belongs to the block (a region cancel reaches it) but no join waits for it.

Children are kept in the order they joined the block; every walk over them goes newest first.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any


class Thread:
    """A leaf: runs `stack` inside `block`; `park` says what it waits for ("" while runnable)."""

    def __init__(self, block: Block, stack: list[Any], env: Any) -> None:
        self.block = block
        self.stack = stack
        self.env = env
        self.alive = True
        self.attached = True
        self.park = ""  # "", "effect", "timer", "signal", "lock", "milestone", "blocked", "interleave"
        self.wid = 0  # the id of what it waits for (effect, timer, wait registration)
        self.timeout = 0  # the timer of a wait/defer timeout
        self.at: Any = None  # the term (and path) it is parked at


class Block:
    kind = "block"

    def __init__(self, parent: Block | None, env: Any, path: str, k: list[Any] | None = None) -> None:
        self.parent = parent
        self.kids: list[Any] = []
        self.threads = 0
        self.attached = True
        self.alive = True
        self.exited = False
        self.env = env
        self.path = path
        self.k = k if k is not None else []

    def add(self, child: Any) -> None:
        self.kids.append(child)
        self.threads += child.attached

    def remove(self, child: Any) -> None:
        self.kids.remove(child)
        self.threads -= child.attached

    def newest_first(self) -> Iterator[Any]:
        return iter(list(reversed(self.kids)))


class Root(Block):
    kind = "root"


class Pass(Block):
    """A block its thread passes through: scope, loop, saga, critical, milestone, call, handler."""

    kind = "pass"

    def __init__(self, parent: Block, env: Any, path: str, k: list[Any], role: str, term: Any = None) -> None:
        super().__init__(parent, env, path, k)
        self.role = role
        self.term = term
        self.iteration = 0  # loop
        self.done: list[tuple[Any, str, str]] = []  # saga: (compensation, its path, its name) per completed step
        self.then: list[Any] = []  # handler: the continuation after the scope
        self.record: Any = None  # handler of on_error: the record it handles


class Split(Block):
    kind = "split"

    def __init__(self, parent: Block, env: Any, path: str, k: list[Any], need: int, each: bool,
                 cancel_remaining: bool, blocking: bool) -> None:
        super().__init__(parent, env, path, k)
        self.need, self.each, self.cancel_remaining, self.blocking = need, each, cancel_remaining, blocking
        self.arrived = 0
        self.fired = False
        self.blocked: list[Thread] = []


class Interleave(Block):
    kind = "interleave"

    def __init__(self, parent: Block, env: Any, path: str, k: list[Any], term: Any, before: list[set[int]]) -> None:
        super().__init__(parent, env, path, k)
        self.term = term
        self.before = before
        self.done = [False] * len(term.branches)
        self.current = -1
        self.arrived = 0
        self.parked: Thread | None = None


class MIBlock(Block):
    kind = "mi"

    def __init__(self, parent: Block, env: Any, path: str, k: list[Any], term: Any, need: int) -> None:
        super().__init__(parent, env, path, k)
        self.term = term
        self.need = need
        self.fired = False
        self.closed = False
        self.outputs: list[Any] = []
        self.started = 0
        self.completed = 0
        self.cancelled = 0
        self.pending = 0  # instances still to start (a big mi starts them a chunk at a time, as the vm does)
        self.items: list[Any] | None = None  # the items of those
        self.spawner: Thread | None = None  # the thread that starts them, a thread of this block until done


class Instance(Block, Mapping[str, Any]):
    """One mi instance, and the data its steps see: its own writes over `item`/`index` over the outer data."""

    kind = "instance"

    def __init__(self, mi: MIBlock, index: int, item: Any, has_item: bool) -> None:
        super().__init__(mi, None, mi.path)
        self.env = self
        self.index, self.item, self.has_item = index, item, has_item
        self.out: dict[str, Any] | None = None
        self.arrived = 0

    def write(self, updates: Mapping[str, Any]) -> None:
        if self.out is None:
            self.out = {}
        self.out.update(updates)

    def _outer(self) -> Mapping[str, Any]:
        assert self.parent is not None
        return self.parent.env  # type: ignore[no-any-return]

    def __getitem__(self, key: str) -> Any:
        if self.out is not None and key in self.out:
            return self.out[key]
        if key == "index":
            return self.index
        if key == "item" and self.has_item:
            return self.item
        return self._outer()[key]

    def _keys(self) -> list[str]:
        keys = dict.fromkeys(self._outer())
        keys["index"] = None
        if self.has_item:
            keys["item"] = None
        keys.update(dict.fromkeys(self.out or {}))
        return list(keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


class Undo(Block):
    """Withdrawn work being undone: handlers `(term, path, name)` run one after another, once every undo
    nested in it has finished."""

    kind = "undo"

    def __init__(self, env: Any, path: str, queue: list[tuple[Any, str, str]]) -> None:
        super().__init__(None, env, path)
        self.queue = queue
        self.started = False
        self.current: tuple[Any, str, str] | None = None


class Compensation(Block):
    """Stands where withdrawn work was while it is undone; then performs `action`."""

    kind = "compensation"

    def __init__(self, parent: Block, env: Any, path: str, action: tuple[Any, ...]) -> None:
        super().__init__(parent, env, path)
        self.action = action
        self.compensated: list[str] = []
        self.failures: list[dict[str, Any]] = []

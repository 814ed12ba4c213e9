"""The vm's execution records: tokens and the frame tree they live in.

Every live token sits in exactly one frame; every frame but the root sits in its parent. A frame is one
activation of a block (a par, a scope, an MI and its instances, a loop, ...). Children hang off an
intrusive doubly-linked list (`head`, `prev`, `next`), so linking, unlinking and withdrawing a region are
O(1) per record touched and cost no extra allocation: cancelling a region costs O(region size), never a scan
of all tokens.

Frames decide what happens when their children are gone: `arrive` (a token reached the end of a branch),
`child_gone` (a child frame closed, a token was withdrawn, or a child stopped being a thread) and `on_close`
(release what the frame held). Those are ordinary methods on the frame classes: the hot loop never inspects a
node type.

Threads and detached work. Joins synchronize threads, not the work a thread leaves running behind it. A frame
counts its children twice: `count` (all of them: the frame closes when it reaches 0) and `live` (those that
are threads of this frame: tokens, and child frames whose thread is still inside). A child frame stops being a
thread of its parent (`attached` becomes False) when its thread goes on while work remains inside: a scope,
loop, call, critical section or milestone the thread left; a par whose first/n join fired (its losers run on);
an mi whose join fired or that has no join; an mi instance whose thread ended. Joins and instance completion
look at `live`; closing, regions and the case's end look at `count`, so detached work still belongs to the
case and to the regions around it.

Snapshots find the record classes by walking the subclasses of `Record` (`record_classes()`): a new frame
class is covered without registering it anywhere.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from .._program import InterleaveSpec, LoopSpec, MISpec, ScopeSpec, SplitSpec
    from ._interp import Interp

# What a parked token waits on (Token.wk).
WK_NONE = 0
WK_EFFECT = 1
WK_TIMER = 2
WK_SIGNAL = 3  # wait or defer (defer may also hold a timer in `aux`)
WK_LOCK = 4
WK_MILESTONE = 5
WK_BLOCKED = 6  # at a blocking par, for the current activation to reset

NO_ITEM: Any = None  # instances made by count= have no item; marked by `has_item`


class Record:
    """Base of every vm record that a snapshot writes as an object (tokens, frames, queues).

    A base class that is never instantiated sets `abstract = True` in its own body.
    """

    __slots__ = ()
    abstract: ClassVar[bool] = True


def record_classes() -> dict[str, type[Record]]:
    """Every record class by name (the snapshot registry), built by walking the subclasses of `Record`."""
    found: dict[str, type[Record]] = {}
    todo: list[type[Record]] = [Record]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__name__ in found and found[sub.__name__] is not sub:
                raise TypeError(f"two vm record classes are named {sub.__name__}: snapshots need unique names")
            if not sub.__dict__.get("abstract", False):
                found[sub.__name__] = sub
            todo.append(sub)
    return found


@dataclass(frozen=True, slots=True)
class MIStats:
    """What an mi `until=` predicate sees."""

    started: int
    completed: int
    cancelled: int
    active: int


class Token(Record):
    """A thread of control: an instruction pointer, its frame, and the data view its steps see."""

    __slots__ = ("ip", "frame", "env", "prev", "next", "alive", "wk", "wid", "aux", "tid")
    attached: ClassVar[bool] = True  # a token is always a thread of its frame

    def __init__(self, tid: int, ip: int, frame: Frame, env: Mapping[str, Any]) -> None:
        self.tid = tid
        self.ip = ip
        self.frame = frame
        self.env = env
        self.prev: Any = None
        self.next: Any = None
        self.alive = True
        self.wk = WK_NONE
        self.wid = 0
        self.aux = 0


class Fifo(Record):
    """A first-in first-out queue for waiters and buffered signals: a list and the index of its head.

    A deque costs about 760 bytes even when it holds one item; an idle case holds one of these per signal
    name it waits on, so a list (compacted once its dead head outgrows the live part) keeps idle cases small.
    """

    __slots__ = ("items", "head")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.head = 0

    def append(self, item: Any) -> None:
        self.items.append(item)

    def peek(self) -> Any:
        return self.items[self.head]

    def popleft(self) -> Any:
        items = self.items
        head = self.head
        item = items[head]
        items[head] = None
        head += 1
        if head * 2 >= len(items):  # the dead head is at least half: drop it (amortised O(1))
            del items[:head]
            head = 0
        self.head = head
        return item

    def __len__(self) -> int:
        return len(self.items) - self.head

    def __bool__(self) -> bool:
        return len(self.items) > self.head


class NoItem(Record):
    """In `MIFrame.items`: an instance to start without an item (made by count=), queued before added ones."""

    __slots__ = ()


class FoldedOutputs(Record):
    """The task outputs of a durable case already encoded for its digest: the head of `Interp.outputs` once they
    outgrew `FOLD_AT` (see `Machine.run`), so the digest at the next record hashes text made a burst at a time.

    `pieces` are JSON texts of consecutive runs of (ip, output) pairs without their brackets; `runs` the tasks'
    instructions in order, run-length encoded as [ip, count, ip, count, ...] (for the node paths a divergence
    names; an mi's million runs of one task are one run, not a million ints for the collector to walk).
    """

    __slots__ = ("pieces", "runs")

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.runs: list[int] = []


def link(frame: Frame, child: Any) -> None:
    head = frame.head
    child.prev = None
    child.next = head
    if head is not None:
        head.prev = child
    frame.head = child
    frame.count += 1
    if child.attached:
        frame.live += 1


def unlink(frame: Frame, child: Any) -> None:
    prev = child.prev
    nxt = child.next
    if prev is None:
        frame.head = nxt
    else:
        prev.next = nxt
    if nxt is not None:
        nxt.prev = prev
    child.prev = child.next = None
    frame.count -= 1
    if child.attached:
        frame.live -= 1


def unlink_thread(frame: Frame, tok: Token) -> None:
    """`unlink` for a token (always a thread of its frame): the hot paths where a thread ends or moves on."""
    prev = tok.prev
    nxt = tok.next
    if prev is None:
        frame.head = nxt
    else:
        prev.next = nxt
    if nxt is not None:
        nxt.prev = prev
    tok.prev = tok.next = None
    frame.count -= 1
    frame.live -= 1


def members(frame: Frame) -> Iterator[Any]:
    """The children of a frame (safe against unlinking the one just yielded)."""
    child = frame.head
    while child is not None:
        nxt = child.next
        yield child
        child = nxt


class Frame(Record):
    """One activation of a block: a node of the frame tree."""

    abstract = True

    __slots__ = ("parent", "head", "count", "live", "attached", "prev", "next", "env", "alive", "ip")

    def __init__(self, parent: Frame | None, env: Mapping[str, Any], ip: int) -> None:
        self.parent = parent
        self.head: Any = None
        self.count = 0  # children: tokens and frames
        self.live = 0  # children that are threads of this frame (see the module docstring)
        self.attached = True  # this frame is a thread of its parent
        self.prev: Any = None
        self.next: Any = None
        self.env = env
        self.alive = True
        self.ip = ip  # the instruction that opened the frame (its node path is the frame's path)

    def arrive(self, m: Interp, tok: Token) -> int:
        """A token hit ARRIVE inside this frame; return where it continues, or -1."""
        raise AssertionError(f"ARRIVE in a {type(self).__name__}")  # the compiler never emits this

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        """A child is gone (already unlinked), or stopped being a thread of this frame.

        `withdrawn`: the child's thread ended without arriving. The default suits a block the thread passes
        through: once its last thread is gone without leaving, the block's own thread was withdrawn.
        """
        if self.attached and self.live == 0:
            m._end_thread(self, withdrawn=True)
        elif self.count == 0:
            m._close(self, withdrawn=False)

    def on_close(self, m: Interp) -> None:
        """Release what the frame holds (locks, milestone counts, region registration)."""


class RootFrame(Frame):
    __slots__ = ()

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        if self.count == 0:
            m._finish_root()


class SplitFrame(Frame):
    """par / multi_choice: counts arrivals; the join fires by the spec's policy.

    Until the join fires the split is a thread of its parent; a first/n join that fired leaves the losers
    running as detached work. A multi-merge ("each") stays a thread while any branch runs: each arrival goes on.
    """

    __slots__ = ("spec", "arrived", "fired", "blocked")

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, spec: SplitSpec) -> None:
        super().__init__(parent, env, ip)
        self.spec = spec
        self.arrived = 0
        self.fired = False
        self.blocked: list[Token] = []  # blocking par: threads waiting to start the next activation

    def arrive(self, m: Interp, tok: Token) -> int:
        unlink_thread(self, tok)
        self.arrived += 1
        spec = self.spec
        if spec.each or (
            not self.fired and (self.live == 0 if spec.need < 0 else (self.arrived >= spec.need or self.live == 0))
        ):
            parent = self.parent
            assert parent is not None
            first = not self.fired
            self.fired = True
            link(parent, tok)  # the arriving token carries on after the join
            tok.frame = parent
            m._joined(self, first)
            if spec.cancel_remaining and self.count:
                m._withdraw_children(self, "join fired")
            self._settle(m, replaced=True)
            return spec.after
        tok.alive = False
        if self.fired:
            m._trace_node("join_late", self.ip, arrived=self.arrived)
        self._settle(m, replaced=False)
        return -1

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        if self.blocked and self.live == 0:
            m._unblock(self)
        if self.attached and not self.fired and self.live == 0:
            if not self.arrived:  # every branch was withdrawn: so is the split
                m._end_thread(self, withdrawn=True)
                return
            self.fired = True  # the rest were withdrawn: what arrived is all there will be
            m._spawn(self.parent, self.spec.after, self.env)
            m._joined(self, True)
            self._settle(m, replaced=True)
            return
        self._settle(m, replaced=False)

    def _settle(self, m: Interp, *, replaced: bool) -> None:
        """After a thread of the split arrived or ended: close it, or leave what remains running detached.

        `replaced`: a token just went on into the parent in the split's place (it keeps the parent's count of
        threads up, so the parent need not be told).
        """
        if self.blocked and self.live == 0:
            m._unblock(self)
        if self.count == 0:
            m._close(self, withdrawn=False)
        elif self.attached and self.fired and (not self.spec.each or self.live == 0):
            if replaced:
                m._detach_thread(self)
            else:
                m._end_thread(self, withdrawn=False)


    def on_close(self, m: Interp) -> None:
        if self.spec.blocking:
            m._forget_blocking(self)


class PassFrame(Frame):
    """A block the thread passes through (loop, scope, critical, milestone, call, interleave)."""

    abstract = True

    __slots__ = ("spec", "exited")

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, spec: Any) -> None:
        super().__init__(parent, env, ip)
        self.spec = spec
        self.exited = False


class LoopFrame(PassFrame):
    __slots__ = ("iteration",)
    spec: LoopSpec

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, spec: LoopSpec) -> None:
        super().__init__(parent, env, ip, spec)
        self.iteration = 0


class ScopeFrame(PassFrame):
    __slots__ = ()
    spec: ScopeSpec

    def on_close(self, m: Interp) -> None:
        m._unregister_region(self.spec.name, self)


class SagaFrame(PassFrame):
    """A saga in progress: `done` lists the compensations of its completed steps, in completion order."""

    __slots__ = ("done",)

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, spec: Any) -> None:
        super().__init__(parent, env, ip, spec)
        self.done: list[tuple[int, str]] = []  # (compensation start ip, name)


class HandlerFrame(PassFrame):
    """A thread running an on_cancel or on_error branch in the normal flow; at its end it goes on at `then`.

    `record`: the error record an on_error branch handles, so that a failure inside it names it as its cause.
    """

    __slots__ = ("then", "record")

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, then: int, record: Any) -> None:
        super().__init__(parent, env, ip, None)
        self.then = then
        self.record = record


class UndoFrame(Frame):
    """Undoing withdrawn work: a saga's compensations (its completed steps, newest first) or a scope's
    on_cancel branch, run one after another once every UndoFrame nested in it has finished (innermost first).

    A cancel never stops it (only a hard cancel does); a failure inside it is recorded in the enclosing
    CompensationFrame and the next handler runs.
    """

    __slots__ = ("queue", "started", "current")

    def __init__(self, env: Mapping[str, Any], ip: int, queue: list[tuple[int, str]]) -> None:
        super().__init__(None, env, ip)
        self.queue = queue  # (handler start ip, name) still to run
        self.started = False
        self.current: tuple[int, str] | None = None  # the handler running now

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        if self.count == 0:
            if not self.started:
                m._start_undo(self)
            else:
                m._close(self, withdrawn=False)


class CompensationFrame(Frame):
    """Stands where withdrawn work was while its sagas and scopes are undone; then performs `action`.

    `action` (plain data): ("catch", on_error ip, after ip, error_into, record), ("resume", on_cancel ip, after ip),
    ("withdrawn",), ("quiet",), ("case_cancelled", reason) or ("case_failed",). It collects what was compensated
    and the compensations that failed.
    """

    __slots__ = ("action", "compensated", "failures")

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, action: tuple[Any, ...]) -> None:
        super().__init__(parent, env, ip)
        self.action = action
        self.compensated: list[str] = []
        self.failures: list[dict[str, Any]] = []

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        if self.count == 0:
            m._compensation_done(self)


class CriticalFrame(PassFrame):
    __slots__ = ("name",)

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, name: str) -> None:
        super().__init__(parent, env, ip, None)
        self.name = name

    def on_close(self, m: Interp) -> None:
        m._release_lock(self.name)


class MilestoneFrame(PassFrame):
    __slots__ = ("name",)

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, name: str) -> None:
        super().__init__(parent, env, ip, None)
        self.name = name

    def on_close(self, m: Interp) -> None:
        m._leave_milestone(self.name, self.ip)


class CallFrame(PassFrame):
    __slots__ = ("ret", "depth")

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, ret: int, depth: int) -> None:
        super().__init__(parent, env, ip, None)
        self.ret = ret
        self.depth = depth


class InterleaveFrame(PassFrame):
    """Runs its branches one at a time; a branch is over only when all of its work is (leftovers too)."""

    __slots__ = ("done", "current", "arrived", "parked")
    spec: InterleaveSpec

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, spec: InterleaveSpec) -> None:
        super().__init__(parent, env, ip, spec)
        self.done = [False] * len(spec.starts)
        self.current = -1
        self.arrived = 0
        self.parked: Token | None = None  # the thread, waiting for its branch's leftover work to end

    def arrive(self, m: Interp, tok: Token) -> int:
        self.done[self.current] = True
        self.arrived += 1
        if self.count > 1:  # work this branch left behind still runs: wait for it
            tok.wk = WK_LOCK
            tok.wid = 0
            starts = self.spec.starts  # parked at its branch's ARRIVE (the instruction before the next branch)
            tok.ip = (starts[self.current + 1] if self.current + 1 < len(starts) else self.spec.after) - 1
            self.parked = tok
            return -1
        return m._interleave_next(self, tok)

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        tok = self.parked
        if tok is not None:
            if self.count == 1:  # only the waiting thread is left: the branch is over
                self.parked = None
                tok.wk = WK_NONE
                tok.ip = m._interleave_next(self, tok)
                m.ready.append(tok)
            return
        if self.count:
            return
        self.done[self.current] = True  # the running branch was withdrawn: go on with the others
        if self.arrived == 0 and all(self.done):
            m._end_thread(self, withdrawn=True)
            return
        tok = m._spawn(self, self.spec.after, self.env)
        tok.ip = m._interleave_next(self, tok)


class MIFrame(Frame):
    """A multiple-instance activation: its children are InstanceFrames (and, while it starts them, a spawner).

    `live` counts the instances still running (and the spawner); an instance whose thread ended is detached,
    even if work it left behind still runs.
    """

    __slots__ = (
        "spec", "fired", "closed", "outputs", "started", "completed", "cancelled", "pending", "items", "spawner"
    )

    def __init__(self, parent: Frame, env: Mapping[str, Any], ip: int, spec: MISpec) -> None:
        super().__init__(parent, env, ip)
        self.spec = spec
        self.fired = False
        self.closed = False  # no more instances may be added (dynamic mi)
        self.outputs: list[Any] = []
        self.started = 0
        self.completed = 0
        self.cancelled = 0
        self.pending = 0  # instances still to start (a big mi starts them SPAWN_CHUNK per vm step)
        # the items of the instances still to start, the last len(items) of the started + pending (NoItem: none)
        self.items: list[Any] | None = None
        self.spawner: Token | None = None  # the token that starts them, a child of this frame until done

    @property
    def running(self) -> int:
        """Instances running now (the spawner is a thread too, but not an instance)."""
        return self.live - (self.spawner is not None)

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        m._mi_check(self)

    def on_close(self, m: Interp) -> None:
        if self.spec.name is not None:
            m._unregister_region(self.spec.name, self)


class InstanceFrame(Frame, Mapping[str, Any]):
    """One MI instance, and the data its steps see: its own writes over `item`/`index` over the case data."""

    __slots__ = ("index", "item", "has_item", "out", "arrived")

    def __init__(self, parent: MIFrame, ip: int, index: int, item: Any, has_item: bool) -> None:
        # every slot set here, without Frame.__init__: this runs once per instance (100,000s per mi)
        self.parent = parent
        self.head = None
        self.count = 0
        self.live = 0
        self.attached = True
        self.prev = None
        self.next = None
        self.alive = True
        self.ip = ip
        self.index = index
        self.item = item
        self.has_item = has_item
        self.out: dict[str, Any] | None = None
        self.arrived = 0

    @property
    def env(self) -> Mapping[str, Any]:
        """The instance is its own data view. A property, not the slot set to `self`: a record referring to
        itself is a reference cycle, which only the cyclic GC frees, so every finished instance would wait for
        a collection (and a million of them make one long pause of the event loop)."""
        return self

    @env.setter
    def env(self, value: Mapping[str, Any]) -> None:
        pass  # (a snapshot restores every slot: this one is always the instance itself)

    def arrive(self, m: Interp, tok: Token) -> int:
        unlink_thread(self, tok)
        tok.alive = False
        self.arrived += 1
        if self.live == 0:  # the instance's threads have all ended: it completed
            m._instance_ended(self)
        return -1

    def child_gone(self, m: Interp, child: Any, withdrawn: bool) -> None:
        if self.attached:
            if self.live == 0:  # completed if a thread of it arrived, else withdrawn
                m._instance_ended(self)
        elif self.count == 0:  # the work a completed instance left behind has ended
            m._close(self, withdrawn=False)

    def merge(self, updates: Mapping[str, Any]) -> None:
        if self.out is None:
            self.out = dict(updates)
        else:
            self.out.update(updates)

    # -- the read-only mapping the instance's steps see --
    def _outer(self) -> Mapping[str, Any]:
        parent = self.parent
        assert parent is not None
        return parent.env

    def __getitem__(self, key: str) -> Any:
        out = self.out
        if out is not None and key in out:
            return out[key]
        if key == "index":
            return self.index
        if key == "item" and self.has_item:
            return self.item
        return self._outer()[key]

    def _keys(self) -> dict[str, None]:
        keys = dict.fromkeys(self._outer())
        keys["index"] = None
        if self.has_item:
            keys["item"] = None
        if self.out:
            keys.update(dict.fromkeys(self.out))
        return keys

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __repr__(self) -> str:
        return f"InstanceData({dict(self)!r})"

    __hash__ = object.__hash__  # records are identities, not values

    def __eq__(self, other: object) -> bool:
        return self is other

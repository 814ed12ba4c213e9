"""Workflow diagrams, drawn from a term: `to_mermaid` and `to_dot` (public in `wfsub.contrib.diagram`, whose
docstring says what is drawn how), and the drawing a program summary keeps (`drawing_of`, `mark_drawing`).

This module sits below the runtime and imports only the algebra, so a Substrate can draw each version it
registers into the version's program summary, and a process without the workflows (a `wfsub.Client`, the
inspector of `wfsub web STORE`) can draw a case on the version it runs, with where it is marked.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping as _Mapping
from dataclasses import dataclass as _dataclass

from ._terms import Retry as _Retry
from ._terms import Term as _Term
from ._terms import branch_name as _branch_name
from ._terms import child_path as _child_path
from ._terms import children as _children

if typing.TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

__all__ = ["to_dot", "to_mermaid"]

_MAX_NODES = 100_000
"""The most terms one diagram draws: past it a diagram is unreadable."""

_MAX_DEPTH = 1_000
"""The deepest nesting drawn: ten times what `validate` accepts (deeper is a mistake, or a term holding itself)."""

_CLUSTERED = frozenset({"scope", "saga", "mi", "critical", "milestone", "net"})
"""Kinds drawn as a cluster (Mermaid subgraph, DOT cluster) holding their own shapes and their children's."""

_Exit = tuple[str, str | None]  # (node id, label of the edge that leaves it)


@_dataclass(slots=True)
class _Node:
    id: str
    shape: str
    label: str
    path: str | None  # the node path of the term it stands for (None: the start and end events)
    role: str  # "" for the shape that stands for the term itself, else what part of it ("join", "error")
    cluster: int  # index into _Diagram.clusters, -1 at top level
    key: tuple[int, int]


@_dataclass(slots=True)
class _Edge:
    src: str
    dst: str
    label: str | None
    style: str  # "flow" | "back" (a loop's back edge) | "assoc" (handlers, compensation, links by name)
    key: tuple[int, int]


@_dataclass(slots=True)
class _Cluster:
    id: str
    kind: str
    label: str
    parent: int
    key: tuple[int, int]


@_dataclass(slots=True)
class _Item:
    """One term (or non-term found in a term's slot) of the tree, in pre-order."""

    term: object
    path: str
    index: int
    cluster: int  # the cluster its own shapes go into
    kids: list[tuple[str, int]]  # (selector, item index), in children() order


@_dataclass(slots=True)
class _Frag:
    """What a drawn term offers its parent: where the flow enters it and where it leaves."""

    entry: str
    exits: list[_Exit]


# -- labels: never raise, whatever a term holds ------------------------------------------------------------


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _repr(value: object, limit: int = 40) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return _short(text, limit)


def _attr(value: object, name: str) -> Any:
    try:
        return getattr(value, name, None)
    except Exception:
        return None


def _fn_name(fn: object) -> str:
    name = _attr(fn, "__name__")
    return _short(name) if isinstance(name, str) and name else _repr(fn)


def _name(value: object) -> str:
    return _short(value) if isinstance(value, str) else _repr(value)


def _str(value: object) -> str:
    """`str(value)`, or its safe repr when even that raises (a selector, a name to look up)."""
    try:
        return str(value)
    except Exception:
        return _repr(value)


def _number(value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}"
    return _repr(value)


def _span(value: object) -> str:
    """A timer's length: `60s`, or `due_in()` when a function computes it from the case data."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}s"
    if callable(value):
        return f"{_fn_name(value)}()"
    return _repr(value)


def _join_label(join: object, branches: int) -> str:
    if join == "all" and isinstance(join, str):
        return "AND"
    if join == "first" and isinstance(join, str):
        return f"1-of-{branches}"
    if join == "each" and isinstance(join, str):
        return "multi-merge (each)"
    if isinstance(join, int) and not isinstance(join, bool):
        return f"{join}-of-{branches}"
    if join is None:
        return "no join"
    return f"join {_repr(join)}"


def _kids_list(term: object) -> list[tuple[str, object]]:
    """(selector, child) of every child slot; [] for a non-term or a term too broken to list its children."""
    if not isinstance(term, _Term):
        return []
    try:
        return [(_str(pair[0]), pair[1]) for pair in _children(term) if isinstance(pair, tuple) and len(pair) == 2]
    except Exception:
        return []


# -- the graph, built once and written out in either format -----------------------------------------------


class _Diagram:
    def __init__(self, term: _Term) -> None:
        self.nodes: dict[str, _Node] = {}
        self.edges: list[_Edge] = []
        self.clusters: list[_Cluster] = []
        self.primary: dict[str, str] = {}  # node path -> id of the shape that stands for it
        self.paths: list[str] = []  # every node path, in pre-order
        self._milestones: dict[str, list[str]] = {}
        self._whens: list[tuple[str, str, int]] = []  # (milestone name, guard id, item index)
        self._regions: dict[str, list[str]] = {}  # region name -> ids of the scopes / mis declaring it
        self._steps: list[tuple[str, str, str, int]] = []  # (verb, region name, step id, item index)
        self._item: _Item | None = None
        self._count = 0
        self._created: list[str] = []  # ids of the shapes the current drawer made (undone if it fails)
        items = self._walk(term)
        self._item = _Item(None, "", -1, -1, [])
        start = self.node("start", "start", role="start", nid="wf_start", path=None)
        frags: list[_Frag | None] = [None] * len(items)
        for item in reversed(items):  # children come after their parent in pre-order: draw them first
            kids = [(sel, frags[k], items[k]) for sel, k in item.kids]
            frags[item.index] = frag = self._draw(item, [(s, f, i) for s, f, i in kids if f is not None])
            self.primary.setdefault(item.path, frag.entry)
        root = frags[0]
        assert root is not None
        self.edge(start, root.entry)
        self._item = _Item(None, "", len(items), -1, [])
        end = self.node("end", "end", role="end", nid="wf_end", path=None)
        self.connect(root.exits, end)
        self._links()

    def _walk(self, term: _Term) -> list[_Item]:
        items: list[_Item] = []
        stack: list[tuple[object, str, int, str, int, int]] = [(term, term.kind, -1, "", -1, 1)]
        while stack:
            value, path, enclosing, selector, parent, depth = stack.pop()
            index = len(items)
            if index >= _MAX_NODES:
                raise ValueError(
                    f"the workflow has more than {_MAX_NODES:,} nodes: a diagram that big cannot be read; draw "
                    "its parts (each a term of its own) one at a time"
                )
            if depth > _MAX_DEPTH:
                raise ValueError(
                    f"the workflow nests terms more than {_MAX_DEPTH:,} deep at {_short(path, 80)} (validate() "
                    f"allows 100; deeper is a mistake, or a term that contains itself): flatten it, or draw its "
                    "parts one at a time"
                )
            cluster = enclosing
            if isinstance(value, _Term) and value.kind in _CLUSTERED:
                cluster = len(self.clusters)
                self.clusters.append(_Cluster(f"c{index}", value.kind, value.kind, enclosing, (index, 0)))
            items.append(_Item(value, path, index, cluster, []))
            self.paths.append(path)
            if parent >= 0:
                items[parent].kids.append((selector, index))
            for sel, child in reversed(_kids_list(value)):
                stack.append((child, _child_path(path, sel, child), cluster, sel, index, depth + 1))
        return items

    # -- building blocks -------------------------------------------------------------------------------

    def node(
        self, shape: str, label: str, *, role: str = "", nid: str | None = None, path: str | None = ""
    ) -> str:
        item = self._item
        assert item is not None
        if nid is None:
            nid = f"n{item.index}_{role}" if role else f"n{item.index}"
            if nid in self.nodes:  # a second part of the same role: number it (ids are never reused)
                nid = f"n{item.index}_{role or 'part'}{sum(1 for n in self._created if n.startswith(nid))}"
        self._count += 1
        where = item.path if path == "" else path
        self.nodes[nid] = _Node(nid, shape, label, where, role, item.cluster, (item.index, self._count))
        self._created.append(nid)
        if not role and where is not None:
            self.primary.setdefault(where, nid)
        return nid

    def edge(self, src: str, dst: str, label: str | None = None, style: str = "flow") -> None:
        item = self._item
        assert item is not None
        self._count += 1
        self.edges.append(_Edge(src, dst, label, style, (item.index, self._count)))

    def connect(self, exits: Iterable[_Exit], dst: str, label: str | None = None, style: str = "flow") -> None:
        for src, exit_label in exits:
            self.edge(src, dst, label if label is not None else exit_label, style)

    def sorted_edges(self) -> list[_Edge]:
        """Edges grouped by their source shape, in drawing order: the text reads along the flow."""
        nodes = self.nodes
        return sorted(self.edges, key=lambda e: (nodes[e.src].key, e.key))

    def _links(self) -> None:
        """Dashed edges between shapes linked by name: milestone -> when_milestone, region step -> region."""
        for name, guard, index in self._whens:
            self._item = _Item(None, "", index, -1, [])
            for flag in self._milestones.get(name, ()):
                if flag in self.nodes and guard in self.nodes:
                    self.edge(flag, guard, "enables", "assoc")
        for verb, name, step, index in self._steps:
            self._item = _Item(None, "", index, -1, [])
            for region in self._regions.get(name, ()):
                if region in self.nodes and step in self.nodes:
                    self.edge(step, region, verb, "assoc")

    # -- one term ----------------------------------------------------------------------------------------

    def _draw(self, item: _Item, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        self._item = item
        term = item.term
        if not isinstance(term, _Term):
            node = self.node("invalid", f"not a term:\n{_repr(term)}")
            return _Frag(node, [(node, None)])
        draw = _DRAWERS.get(term.kind)
        before = len(self.edges)
        self._created = []
        try:
            if draw is not None:
                return draw(self, term, kids)
        except Exception as exc:  # a term broken in a way no drawer foresaw: still draw something
            del self.edges[before:]
            for nid in self._created:
                del self.nodes[nid]
                if self.primary.get(item.path) == nid:
                    del self.primary[item.path]
            return self._generic(term, kids, note=f"could not draw: {type(exc).__name__}")
        return self._generic(term, kids)

    def _generic(self, term: _Term, kids: list[tuple[str, _Frag, _Item]], note: str = "") -> _Frag:
        label = term.kind + (f"\n{note}" if note else "")
        head = self.node("unknown" if not note else "invalid", label)
        exits: list[_Exit] = []
        for _, frag, _ in kids:
            self.edge(head, frag.entry)
            exits.extend(frag.exits)
        return _Frag(head, exits or [(head, None)])

    def _index(self) -> int:
        assert self._item is not None
        return self._item.index

    # -- leaves --------------------------------------------------------------------------------------------

    def _task(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        name = t.name if isinstance(t.name, str) and t.name else _fn_name(t.fn)
        node = self.node("task", name)
        return _Frag(node, [(node, None)])

    def _effect(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        name = t.name if isinstance(t.name, str) and t.name else _fn_name(t.fn)
        notes = []
        if t.timeout is not None:
            notes.append(f"timeout {_number(t.timeout)}s")
        heartbeat_timeout = getattr(t, "heartbeat_timeout", None)
        if heartbeat_timeout is not None:
            notes.append(f"heartbeat {_number(heartbeat_timeout)}s")
        if t.retry is not None:
            attempts = _attr(t.retry, "max_attempts")
            elapsed = _attr(t.retry, "max_elapsed")
            if attempts is None and isinstance(t.retry, _Retry):  # no count limit
                notes.append("retry ∞" if elapsed is None else f"retry ≤{_number(elapsed)}s")
            elif attempts is not None:
                notes.append(f"retry ×{_number(attempts)}" + (f" ≤{_number(elapsed)}s" if elapsed is not None else ""))
            else:
                notes.append(f"retry {_repr(t.retry)}")
        label = "\n".join([f"effect: {name}", *([", ".join(notes)] if notes else [])])
        node = self.node("effect", label)
        return _Frag(node, [(node, None)])

    def _wait(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        reply = _attr(t, "reply")
        check = _attr(t, "check")
        lines = [f"update: {_name(t.signal)}" if reply is not None else f"signal: {_name(t.signal)}"]
        if reply is not None:
            lines.append(f"reply {_fn_name(reply)}")
        if check is not None:
            lines.append(f"check {_fn_name(check)}")
        if t.into is not None:
            lines.append(f"into {_name(t.into)}")
        if t.timeout is not None:
            lines.append(f"timeout {_span(t.timeout)}")
        deadline = _attr(t, "deadline")
        if deadline is not None:
            lines.append(f"deadline {_span(deadline)}")
        if t.transient is True:
            lines.append("transient")
        node = self.node("event", "\n".join(lines))
        return _Frag(node, [(node, None)])

    def _sleep(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        until = _attr(t, "until")
        when = f"until {_span(until)}" if until is not None else _span(t.seconds)
        node = self.node("event", f"timer: {when}")
        return _Frag(node, [(node, None)])

    def _reply(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        node = self.node("throw", f"reply to update {_name(t.name)}\n{_fn_name(t.fn)}")
        return _Frag(node, [(node, None)])

    def _call(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        node = self.node("call", f"call {_name(t.name)}")
        return _Frag(node, [(node, None)])

    def _start_case(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        # a call activity that runs as a case of its own: waited for (or not), cancelled with the parent (or not)
        lines = [f"start case: {_name(t.workflow)}", "waits" if t.wait is not False else "does not wait"]
        if t.into is not None:
            lines.append(f"into {_name(t.into)}")
        if t.on_parent_cancel == "abandon":
            lines.append("abandoned on cancel")
        node = self.node("call", "\n".join(lines))
        return _Frag(node, [(node, None)])

    def _signal_case(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        node = self.node("throw", f"signal case: {_name(t.name)}")  # a message throw event
        return _Frag(node, [(node, None)])

    def _terminate(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        node = self.node("terminate", "terminate")
        return _Frag(node, [])  # the case ends here: nothing flows on

    def _region_step(self, verb: str, label: str, t: Any) -> _Frag:
        node = self.node("throw", label)
        if isinstance(t.name, str):
            self._steps.append((verb, t.name, node, self._index()))
        return _Frag(node, [(node, None)])

    def _cancel_region(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        return self._region_step("cancels", f"cancel region {_name(t.name)}", t)

    def _complete_region(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        return self._region_step("completes", f"complete region {_name(t.name)}", t)

    def _add_instances(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        items = f"\nitems: {_fn_name(t.items)}" if t.items is not None else ""
        return self._region_step("adds to", f"add instances to {_name(t.name)}{items}", t)

    def _close_instances(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        return self._region_step("closes", f"close instances of {_name(t.name)}", t)

    # -- control flow ----------------------------------------------------------------------------------

    def _seq(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        if not kids:
            node = self.node("invalid", "empty seq")
            return _Frag(node, [(node, None)])
        for (_, a, _), (_, b, _) in zip(kids, kids[1:]):
            self.connect(a.exits, b.entry)
        return _Frag(kids[0][1].entry, kids[-1][1].exits)

    def _split_join(
        self, split: str, join: str, kids: list[tuple[str, _Frag, _Item]], labels: _Mapping[str, str] | None = None
    ) -> _Frag:
        head = self.node("gateway", split)
        tail = self.node("gateway", join, role="join")
        for sel, frag, _ in kids:
            self.edge(head, frag.entry, (labels or {}).get(sel))
            self.connect(frag.exits, tail)
        if not kids:
            self.edge(head, tail)
        return _Frag(head, [(tail, None)])

    def _par(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        join = _join_label(t.join, len(kids))
        if t.cancel_remaining is True:
            join += "\ncancel remaining"
        if t.blocking is True:
            join += "\nblocking"
        return self._split_join("AND", join, kids)

    def _case_labels(self, t: Any) -> dict[str, str]:
        labels = {"default": "default"}
        cases = t.cases if isinstance(t.cases, tuple) else ()
        for i, case in enumerate(cases):
            if isinstance(case, tuple) and len(case) == 2:
                labels[str(i)] = _fn_name(case[0])
        return labels

    def _xor(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        return self._split_join("XOR", "XOR", kids, self._case_labels(t))

    def _multi_choice(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        return self._split_join("OR", "OR", kids, self._case_labels(t))

    def _interleave(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        frag = self._split_join("interleave\n(one at a time)", "interleave\ndone", kids)
        by_ref: dict[object, str] = {}
        for sel, branch, item in kids:
            by_ref[int(sel)] = branch.entry
            name = _branch_name(item.term) if isinstance(item.term, _Term) else None
            if name is not None:
                by_ref.setdefault(name, branch.entry)
        for pair in t.order if isinstance(t.order, tuple) else ():
            if isinstance(pair, tuple) and len(pair) == 2:
                before, after = (by_ref.get(ref) if isinstance(ref, str | int) else None for ref in pair)
                if before is not None and after is not None:
                    self.edge(before, after, "before", "assoc")
        return frag

    def _loop(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        body = kids[0][1] if kids else None
        if t.while_ is not None:
            cond = f"while {_fn_name(t.while_)}"
        elif t.until is not None:
            cond = f"until {_fn_name(t.until)}"
        elif t.times is not None:
            cond = f"×{_number(t.times)}"
        else:
            cond = "?"
        limit = f"\nmax {_number(t.max_iterations)}" if t.max_iterations is not None else ""
        if t.until is not None and t.while_ is None:  # post-test: the body runs first
            entry = self.node("gateway", "loop", role="in")
            test = self.node("gateway", f"loop {cond}{limit}")
            if body is not None:
                self.edge(entry, body.entry)
                self.connect(body.exits, test)
            else:
                self.edge(entry, test)
            self.edge(test, entry, f"again ({cond})", "back")
            return _Frag(entry, [(test, "done")])
        test = self.node("gateway", f"loop {cond}{limit}")
        if body is not None:
            self.edge(test, body.entry)
            self.connect(body.exits, test, f"again ({cond})", "back")
        return _Frag(test, [(test, "done")])

    def _defer(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        deadline = _attr(t, "deadline")
        timeout = f"\ntimeout {_span(t.timeout)}" if t.timeout is not None else ""
        if deadline is not None:
            timeout = f"\ndeadline {_span(deadline)}"
        head = self.node("event_gateway", f"event-based\n(defer){timeout}")
        tail = self.node("gateway", "XOR", role="join")
        by_sel = {sel: frag for sel, frag, _ in kids}
        pairs = t.branches if isinstance(t.branches, tuple) else ()
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, tuple) and len(pair) == 2):
                continue
            event = self.node("event", f"signal: {_name(pair[0])}", role=f"signal{i}")
            self.edge(head, event)
            frag = by_sel.get(_str(pair[0]))
            if frag is None:
                self.edge(event, tail)
            else:
                self.edge(event, frag.entry)
                self.connect(frag.exits, tail)
        if t.timeout is not None or deadline is not None or "timeout" in by_sel:
            when = _span(t.timeout) if t.timeout is not None else f"until {_span(deadline)}" \
                if deadline is not None else "?"
            timer = self.node("event", f"timer: {when}", role="timeout")
            self.edge(head, timer)
            handler = by_sel.get("timeout")
            if handler is None:
                self.edge(timer, tail)
            else:
                self.edge(timer, handler.entry)
                self.connect(handler.exits, tail)
        if not pairs and t.timeout is None and deadline is None:
            self.edge(head, tail)
        return _Frag(head, [(tail, None)])

    def _mi(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        self._cluster_label(f"mi {_name(t.name)}" if t.name is not None else "multiple instances")
        lines = ["MI |||"]
        if t.count is not None:
            lines.append(f"count: {_fn_name(t.count) if callable(t.count) else _number(t.count)}")
        if t.items is not None:
            lines.append(f"items: {_fn_name(t.items)}")
        if t.dynamic is True:
            lines.append("dynamic")
        head = self.node("mi_split", "\n".join(lines))
        if t.join == "all" and isinstance(t.join, str):
            joins = ["MI join: all"]
        elif t.join is None:
            joins = ["MI: no join"]
        elif t.join == "first" and isinstance(t.join, str):
            joins = ["MI join: first"]
        elif isinstance(t.join, int) and not isinstance(t.join, bool):
            joins = [f"MI join: {t.join} done"]
        else:
            joins = [f"MI join: {_repr(t.join)}"]
        if t.cancel_remaining is True and t.join not in ("all", None):
            joins.append("cancel remaining")
        if t.min is not None or t.max is not None:
            joins.append(f"min {_number(t.min)}, max {_number(t.max)}")
        if t.until is not None:
            joins.append(f"until {_fn_name(t.until)}")
        if t.collect is not None:
            joins.append(f"collect into {_name(t.collect)}")
        tail = self.node("mi_join", "\n".join(joins), role="join")
        if kids:
            self.edge(head, kids[0][1].entry)
            self.connect(kids[0][1].exits, tail)
        else:
            self.edge(head, tail)
        if isinstance(t.name, str):
            self._regions.setdefault(t.name, []).append(head)
        return _Frag(head, [(tail, None)])

    # -- clusters --------------------------------------------------------------------------------------

    def _cluster_label(self, label: str) -> None:
        item = self._item
        assert item is not None
        if item.cluster >= 0:
            self.clusters[item.cluster].label = label

    def _body(self, head: str, kids: list[tuple[str, _Frag, _Item]], selector: str = "") -> list[_Exit]:
        for sel, frag, _ in kids:
            if sel == selector:
                self.edge(head, frag.entry)
                return list(frag.exits)
        return [(head, None)]

    def _scope(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        self._cluster_label(f"scope {_name(t.name)}")
        head = self.node("region", f"scope {_name(t.name)}")
        if isinstance(t.name, str):
            self._regions.setdefault(t.name, []).append(head)
        exits = self._body(head, kids)
        handlers = {sel: frag for sel, frag, _ in kids}
        if "on_error" in handlers:
            into = t.error_into if isinstance(t.error_into, str) else _repr(t.error_into)
            boundary = self.node("event", f"error\n→ data[{into!r}]", role="error")
            self.edge(head, boundary, "on_error", "assoc")
            self.edge(boundary, handlers["on_error"].entry)
            exits.extend(handlers["on_error"].exits)
        if "on_cancel" in handlers:
            boundary = self.node("event", "cancelled", role="cancel")
            self.edge(head, boundary, "on_cancel", "assoc")
            self.edge(boundary, handlers["on_cancel"].entry)
            exits.extend(handlers["on_cancel"].exits)
        if "finally" in handlers:  # after the body and the handlers; also when the body fails or is withdrawn
            final = handlers["finally"]
            self.connect(exits, final.entry)
            self.edge(head, final.entry, "finally", "assoc")
            exits = list(final.exits)
        return _Frag(head, exits)

    def _saga(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        head = self.node("region", "saga")
        actions = [(sel, frag) for sel, frag, _ in kids if not sel.endswith(".compensation")]
        comps = {sel.removesuffix(".compensation"): frag for sel, frag, _ in kids if sel.endswith(".compensation")}
        exits: list[_Exit] = [(head, None)]
        undo: list[_Frag] = []  # compensations in step order; they run in reverse
        for sel, frag in actions:
            self.connect(exits, frag.entry)
            exits = list(frag.exits)
            comp = comps.get(sel)
            if comp is not None:
                self.edge(frag.entry, comp.entry, "compensate", "assoc")
                undo.append(comp)
        for later, earlier in zip(reversed(undo), list(reversed(undo))[1:]):
            self.connect(later.exits, earlier.entry, "then", "assoc")
        return _Frag(head, exits)

    def _critical(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        self._cluster_label(f"critical {_name(t.name)}")
        head = self.node("lock", f"lock {_name(t.name)}\n(one at a time)")
        return _Frag(head, self._body(head, kids))

    def _milestone(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        self._cluster_label(f"milestone {_name(t.name)}")
        head = self.node("flag", f"milestone {_name(t.name)}\nreached while inside")
        if isinstance(t.name, str):
            self._milestones.setdefault(t.name, []).append(head)
        return _Frag(head, self._body(head, kids))

    def _when_milestone(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        head = self.node("flag", f"when milestone\n{_name(t.name)}")
        if isinstance(t.name, str):
            self._whens.append((t.name, head, self._index()))
        return _Frag(head, self._body(head, kids))

    # -- net: an unstructured graph of terms ------------------------------------------------------------

    def _net(self, t: Any, kids: list[tuple[str, _Frag, _Item]]) -> _Frag:
        raw_nodes = _attr(t, "nodes")
        pairs = list(raw_nodes.items()) if isinstance(raw_nodes, _Mapping) else raw_nodes
        listed = pairs if isinstance(pairs, list | tuple) else ()
        names = [_str(pair[0]) for pair in listed if isinstance(pair, tuple) and len(pair) == 2]
        self._cluster_label("net")
        head = self.node("region", "net")
        by_sel = {sel: (frag, item) for sel, frag, item in kids}
        frags: dict[str, _Frag] = {}
        for pos, name in enumerate(names):
            found = by_sel.get(name) or (kids[pos][1:] if pos < len(kids) else None)
            if found is None:
                continue
            frag, item = found
            frags[name] = frag
            shown = self.nodes.get(self.primary.get(item.path, frag.entry))
            if shown is not None and shown.label.split("\n")[0] != name:
                shown.label = f"{name}: {shown.label}"
        edges: list[tuple[str, str, str | None]] = []
        raw_edges = _attr(t, "edges")
        for e in raw_edges if isinstance(raw_edges, list | tuple) else ():
            if isinstance(e, tuple) and len(e) in (2, 3):
                pred = _fn_name(e[2]) if len(e) == 3 and callable(e[2]) else None
                if len(e) == 3 and e[2] is not None and pred is None:
                    pred = _name(e[2])
                edges.append((_str(e[0]), _str(e[1]), pred))
            else:
                self.node("invalid", f"not an edge:\n{_repr(e)}", role="bad_edge")
        # "start" and "end" are the net's own entry and exit: the net's head shape and its way out.
        for src, dst, _ in edges:
            for name, reserved in ((src, "start"), (dst, "end")):
                if name not in frags and name != reserved:
                    bad = self.node("invalid", f"no node {name!r}", role="missing")
                    frags[name] = _Frag(bad, [(bad, None)])
        out: dict[str, list[tuple[str, str | None]]] = {}
        incoming: dict[str, int] = {}
        for src, dst, pred in edges:
            out.setdefault(src, []).append((dst, pred))
            incoming[dst] = incoming.get(dst, 0) + 1
        split, join = _pairs_map(_attr(t, "split")), _pairs_map(_attr(t, "join"))
        entries: dict[str, str] = {}
        for pos, name in enumerate(frags):
            entries[name] = frags[name].entry
            if incoming.get(name, 0) > 1:
                gate = self.node("gateway", _net_kind(join, name, incoming[name], "XOR"), role=f"join{pos}")
                self.edge(gate, frags[name].entry)
                entries[name] = gate
        exits: list[_Exit] = []
        sources: list[tuple[str, list[_Exit]]] = [("start", [(head, None)])]
        sources += [(name, frags[name].exits) for name in frags]
        for pos, (name, leaving) in enumerate(sources):
            targets = out.get(name, [])
            if len(targets) > 1:
                gate = self.node("gateway", _net_kind(split, name, len(targets), "AND"), role=f"split{pos}")
                self.connect(leaving, gate)
                leaving = [(gate, None)]
                for dst, pred in targets:
                    if dst == "end":
                        exits.append((gate, pred))
                    else:
                        self.edge(gate, entries[dst], pred)
            elif targets:
                dst, pred = targets[0]
                if dst == "end":
                    exits.extend((src, pred if pred is not None else label) for src, label in leaving)
                else:
                    self.connect(leaving, entries[dst], pred)
        return _Frag(head, exits if frags else [(head, None)])


def _pairs_map(value: object) -> object:
    """A net's split= / join= as a mapping (the term keeps them as a tuple of (node, kind) pairs)."""
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        return dict(value)
    return value


def _net_kind(value: object, name: str, degree: int, default: str) -> str:
    if isinstance(value, _Mapping):
        value = value.get(name)
    if value is None:
        return default
    if isinstance(value, str):
        word = value.lower()
        if word in ("and", "all"):
            return "AND"
        if word in ("xor", "or"):
            return word.upper()
        if word == "first":
            return f"1-of-{degree}"
        if word == "each":
            return "multi-merge (each)"
        return _short(value, 24)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value}-of-{degree}"
    return _repr(value, 24)


if typing.TYPE_CHECKING:
    _Drawer = Callable[[_Diagram, Any, list[tuple[str, _Frag, _Item]]], _Frag]
_DRAWERS: dict[str, _Drawer] = {
    "task": _Diagram._task,
    "effect": _Diagram._effect,
    "seq": _Diagram._seq,
    "par": _Diagram._par,
    "xor": _Diagram._xor,
    "multi_choice": _Diagram._multi_choice,
    "loop": _Diagram._loop,
    "wait": _Diagram._wait,
    "defer": _Diagram._defer,
    "sleep": _Diagram._sleep,
    "scope": _Diagram._scope,
    "saga": _Diagram._saga,
    "mi": _Diagram._mi,
    "interleave": _Diagram._interleave,
    "critical": _Diagram._critical,
    "milestone": _Diagram._milestone,
    "when_milestone": _Diagram._when_milestone,
    "call": _Diagram._call,
    "start_case": _Diagram._start_case,
    "signal_case": _Diagram._signal_case,
    "terminate": _Diagram._terminate,
    "reply": _Diagram._reply,
    "cancel_region": _Diagram._cancel_region,
    "complete_region": _Diagram._complete_region,
    "add_instances": _Diagram._add_instances,
    "close_instances": _Diagram._close_instances,
    "net": _Diagram._net,
}
"""One drawer per term kind (a kind without one is drawn as a plain box with its children)."""


# -- input checks --------------------------------------------------------------------------------------------


def _check_term(term: object, fn: str) -> _Term:
    if isinstance(term, _Term):
        return term
    hint = "pass a workflow term built with task(), effect(), seq(), par(), ..."
    if callable(term):
        hint = f"wrap the function as task({_fn_name(term)}) or effect({_fn_name(term)}) first"
    raise TypeError(f"{fn}() draws a workflow term, got {type(term).__name__} {_repr(term)}: {hint}")


def _called(term: _Term, paths: list[str]) -> list[str]:
    """The paths of the `call` steps of `term` that call a library workflow some of `paths` point into (a case's
    thread inside a called workflow is reported at `library['name']....`)."""
    names = {m.group(2) for p in paths if (m := _LIBRARY.match(p))}
    found: list[str] = []
    stack: list[tuple[object, str]] = [(term, term.kind)]
    while stack:
        node, at = stack.pop()
        if getattr(node, "kind", None) == "call" and getattr(node, "name", None) in names:
            found.append(at)
        if isinstance(node, _Term):
            stack.extend((child, _child_path(at, sel, child)) for sel, child in _children(node))
    return found


_LIBRARY = re.compile(r"""^library\[(['"])(.*?)\1\]""")


def _highlighted(diagram: _Diagram, highlight: object, fn: str, term: _Term | None = None) -> set[str]:
    """The ids of the shapes to mark; a path the workflow does not have is an error that lists real ones. A path
    into a called library workflow marks the call steps that call it."""
    if highlight is None:
        return set()
    paths: list[str]
    if isinstance(highlight, str):
        paths = [highlight]
    else:
        try:
            paths = list(highlight)  # type: ignore[call-overload]
        except TypeError:
            raise TypeError(
                f"{fn}(highlight=...) takes node paths (an iterable of str), got {type(highlight).__name__}: "
                "pass e.g. highlight=['seq[1].wait'] or a case's status().at"
            ) from None
    wrong = [p for p in paths if not isinstance(p, str)]
    if wrong:
        raise TypeError(
            f"{fn}(highlight=...) takes node paths as str, got {_repr(wrong[0])} ({type(wrong[0]).__name__}) "
            "among them: pass the paths as strings, e.g. highlight=['seq[1].wait']"
        )
    if term is not None and any(p.startswith("library[") for p in paths):
        calls = _called(term, paths)
        paths = [p for p in paths if not p.startswith("library[")] + calls
    unknown = [p for p in dict.fromkeys(paths) if p not in diagram.primary]
    if unknown:
        near: list[str] = []
        for p in unknown:
            near.extend(m for m in difflib.get_close_matches(p, diagram.paths, n=3) if m not in near)
        examples = (near + [p for p in diagram.paths if p not in near])[:5]
        raise ValueError(
            f"{fn}(highlight=...) names node path(s) that are not in this workflow: "
            f"{', '.join(repr(p) for p in unknown)}; its paths include {', '.join(repr(p) for p in examples)}: "
            "pass node paths of this same term, as validate() and a case's status().at report them"
        )
    return {diagram.primary[p] for p in paths}


# -- Mermaid ---------------------------------------------------------------------------------------------------

_MM_SHAPES: dict[str, tuple[str, str, str]] = {  # shape -> (open, close, class)
    "start": ("((", "))", "startEvent"),
    "end": ("((", "))", "endEvent"),
    "terminate": ("((", "))", "terminateEvent"),
    "task": ("(", ")", "task"),
    "effect": ("[[", "]]", "effect"),
    "call": ("[", "]", "callActivity"),
    "gateway": ("{", "}", "gateway"),
    "event_gateway": ("{{", "}}", "eventGateway"),
    "event": ("(((", ")))", "event"),
    "mi_split": ("[/", "\\]", "multiInstance"),
    "mi_join": ("[\\", "/]", "multiInstance"),
    "region": ("([", "])", "region"),
    "lock": ("[/", "/]", "lock"),
    "flag": ("[\\", "\\]", "flag"),
    "throw": (">", "]", "regionStep"),
    "invalid": ("[", "]", "invalid"),
    "unknown": ("[", "]", "unknown"),
}

_MM_STYLES: dict[str, str] = {
    "startEvent": "fill:#e8f5e9,stroke:#2e7d32,stroke-width:2px",
    "endEvent": "fill:#ffebee,stroke:#b71c1c,stroke-width:5px",
    "terminateEvent": "fill:#212121,color:#ffffff,stroke:#000000,stroke-width:5px",
    "task": "fill:#fffde7,stroke:#5d4037",
    "effect": "fill:#e3f2fd,stroke:#0d47a1,stroke-width:3px",
    "callActivity": "fill:#fffde7,stroke:#000000,stroke-width:5px",
    "gateway": "fill:#fff3e0,stroke:#e65100",
    "eventGateway": "fill:#fff3e0,stroke:#e65100,stroke-width:3px",
    "event": "fill:#f3e5f5,stroke:#4a148c",
    "multiInstance": "fill:#e0f2f1,stroke:#004d40",
    "region": "fill:#eceff1,stroke:#37474f",
    "lock": "fill:#fce4ec,stroke:#880e4f",
    "flag": "fill:#f1f8e9,stroke:#33691e",
    "regionStep": "fill:#ede7f6,stroke:#311b92",
    "invalid": "fill:#ffcdd2,stroke:#b71c1c,stroke-width:2px,stroke-dasharray:4 2",
    "unknown": "fill:#ffffff,stroke:#9e9e9e,stroke-dasharray:2 2",
    "highlight": "fill:#ffeb3b,stroke:#d50000,stroke-width:4px",
}

_MM_EDGES = {"flow": "-->", "back": "==>", "assoc": "-.->"}

_MM_ESCAPES = {
    '"': "#quot;",
    "#": "#35;",
    "&": "#amp;",
    "<": "#lt;",
    ">": "#gt;",
    "|": "#124;",
    "`": "#96;",
    "%": "#37;",
    "\n": "<br>",
}


def _clean(text: str) -> str:
    """Line breaks as \\n, every other control character as a space."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return "".join(c if c == "\n" or c >= " " and c != "\x7f" else " " for c in text)


def _mm_text(text: str) -> str:
    """Text for inside a double-quoted Mermaid label: entity codes for what Mermaid would read as syntax."""
    return '"' + "".join(_MM_ESCAPES.get(c, c) for c in _clean(text)) + '"'


def _mm_comment(text: str) -> str:
    """Text for a `%%` comment line: one line, and `%` written `%25`, so that no name makes a `%%{init: ...}%%`
    directive, which Mermaid reads wherever it stands, comment lines included, and which would reconfigure the
    renderer (its theme, its security level, HTML labels)."""
    return _clean(text).replace("%", "%25").replace("\n", " ")


def _nest(diagram: _Diagram) -> dict[int, list[tuple[tuple[int, int], str, object]]]:
    """Per cluster (-1: top level), its nodes and child clusters in drawing order."""
    members: dict[int, list[tuple[tuple[int, int], str, object]]] = {}
    for node in diagram.nodes.values():
        members.setdefault(node.cluster, []).append((node.key, "node", node))
    for index, cluster in enumerate(diagram.clusters):
        members.setdefault(cluster.parent, []).append((cluster.key, "cluster", index))
    for entries in members.values():
        entries.sort(key=lambda e: e[0])
    return members


def _write_nested(
    diagram: _Diagram,
    open_cluster: Callable[[_Cluster, str], list[str]],
    close_cluster: Callable[[str], str],
    write_node: Callable[[_Node, str], list[str]],
    indent: str,
) -> list[str]:
    """Clusters and nodes, nested, without recursion (a deep term nests its clusters as deep)."""
    members = _nest(diagram)
    lines: list[str] = []
    stack: list[tuple[int, int]] = [(-1, 0)]  # (cluster, position among its members)
    while stack:
        cluster, pos = stack[-1]
        entries = members.get(cluster, [])
        pad = indent * min(len(stack), 12)
        if pos >= len(entries):
            stack.pop()
            if cluster >= 0:
                lines.append(close_cluster(indent * min(len(stack), 12)))
            continue
        stack[-1] = (cluster, pos + 1)
        _, what, value = entries[pos]
        if what == "node":
            assert isinstance(value, _Node)
            lines.extend(write_node(value, pad))
        else:
            assert isinstance(value, int)
            lines.extend(open_cluster(diagram.clusters[value], pad))
            stack.append((value, 0))
    return lines


def _tooltip(node: _Node) -> str:
    if node.path is None:
        return node.role
    return node.path if not node.role else f"{node.path} ({node.role})"


def to_mermaid(term: _Term, highlight: Iterable[str] | None = None) -> str:
    """A Mermaid flowchart (`flowchart LR ...`) of `term`; `highlight` marks the shapes at these node paths (such
    as a case's `status().at`).

    Each shape is preceded by a comment line `%% <id>: <node path>` (`<node path> (<part>)` for a shape that is
    a part of its term, such as a par's join; `start` / `end` for the events; a `%` in it is written `%25`, and a
    line break as a space, so no name makes a Mermaid directive). Mermaid's default limits (50,000 characters,
    500 edges) fit workflows of a few hundred nodes; raise `maxTextSize` and `maxEdges` in the renderer's config
    for bigger ones (the inspector, `wfsub.contrib.web`, raises them to 100,000,000 and 1,000,000: past what the
    largest workflow drawn, 100,000 nodes, needs). Raises TypeError for a non-term, and ValueError for a
    highlighted path the workflow does not have.
    """
    diagram = _Diagram(_check_term(term, "to_mermaid"))
    marked = _highlighted(diagram, highlight, "to_mermaid", term)
    return _mermaid(diagram) + _mm_marks(sorted(marked, key=lambda i: diagram.nodes[i].key))


def _mermaid(diagram: _Diagram) -> str:
    """The Mermaid text of a diagram with nothing marked (the marks are lines added at its end: `_mm_marks`)."""
    lines = ["flowchart LR", "    %% drawn by wfsub.to_mermaid: '%% <id>: <path>' names the term each shape stands for"]

    def write_node(node: _Node, pad: str) -> list[str]:
        left, right, _ = _MM_SHAPES[node.shape]
        shape = f"{pad}{node.id}{left}{_mm_text(node.label)}{right}"
        return [f"{pad}%% {node.id}: {_mm_comment(_tooltip(node))}", shape]

    def open_cluster(cluster: _Cluster, pad: str) -> list[str]:
        return [f"{pad}subgraph {cluster.id} [{_mm_text(cluster.label)}]"]

    lines.extend(_write_nested(diagram, open_cluster, lambda pad: f"{pad}end", write_node, "    "))
    for e in diagram.sorted_edges():
        arrow = _MM_EDGES[e.style]
        label = f"|{_mm_text(e.label)}|" if e.label else ""
        lines.append(f"    {e.src} {arrow}{label} {e.dst}")
    by_class: dict[str, list[str]] = {}
    for node in sorted(diagram.nodes.values(), key=lambda n: n.key):
        by_class.setdefault(_MM_SHAPES[node.shape][2], []).append(node.id)
    lines.extend(f"    classDef {name} {_MM_STYLES[name]}" for name in by_class)
    for name, ids in by_class.items():
        lines.append(f"    class {','.join(ids)} {name}")
    link_styles = [str(i) for i, e in enumerate(diagram.sorted_edges()) if e.style == "assoc"]
    if link_styles:
        lines.append(f"    linkStyle {','.join(link_styles)} stroke:#546e7a")
    return "\n".join(lines) + "\n"


def _mm_marks(ids: Sequence[str]) -> str:
    """The lines that mark shapes (by id) as highlighted, added after a drawing's own: a `class` line given last
    wins over the shape's own class."""
    if not ids:
        return ""
    return f"    classDef highlight {_MM_STYLES['highlight']}\n    class {','.join(ids)} highlight\n"


# -- a drawing kept in a program summary -------------------------------------------------------------------------


def drawing_of(term: _Term) -> dict[str, Any]:
    """The drawing of a workflow version as a program summary keeps it (JSON): its Mermaid text with nothing marked
    (`mermaid`), the id of the shape that stands for each node path (`shapes`), and, per workflow a `call` step
    calls, the paths of those steps (`calls`: a thread inside a called workflow is marked on its call step).
    `mark_drawing(drawing, paths)` gives what `to_mermaid(term, highlight=paths)` gives, without the term.
    Raises ValueError for a term too big or too deep to draw (as `to_mermaid` does)."""
    diagram = _Diagram(_check_term(term, "drawing_of"))
    calls: dict[str, list[str]] = {}
    stack: list[tuple[object, str]] = [(term, term.kind)]
    while stack:  # (iterative, as the diagram's own walk: any depth)
        node, at = stack.pop()
        name = _attr(node, "name")
        if _attr(node, "kind") == "call" and isinstance(name, str) and at in diagram.primary:
            calls.setdefault(name, []).append(at)
        stack.extend((child, _child_path(at, sel, child)) for sel, child in _kids_list(node))
    nodes = diagram.nodes
    shapes = dict(sorted(diagram.primary.items(), key=lambda kv: nodes[kv[1]].key if kv[1] in nodes else (-1, 0)))
    return {"mermaid": _mermaid(diagram), "shapes": shapes, "calls": calls}


def mark_drawing(drawing: _Mapping[str, Any], highlight: Iterable[str]) -> tuple[str, list[str]]:
    """A kept drawing's Mermaid text with the shapes at these node paths marked (as `to_mermaid(term,
    highlight=)` marks them), and the paths it has no shape for (left unmarked: the caller says so)."""
    text = drawing.get("mermaid")
    shapes = drawing.get("shapes")
    calls = drawing.get("calls")
    if not isinstance(text, str) or not isinstance(shapes, _Mapping):
        raise ValueError("not a drawing kept by drawing_of(): it has no Mermaid text and shapes")
    calls = calls if isinstance(calls, _Mapping) else {}
    ids: list[str] = []
    missing: list[str] = []
    for path in highlight:
        found = _LIBRARY.match(path)
        targets = list(calls.get(found.group(2), ())) if found else [path]
        marked = [shapes[p] for p in targets if isinstance(shapes.get(p), str)]
        if not marked:
            missing.append(path)
        ids.extend(i for i in marked if i not in ids)
    order = {shape: index for index, shape in enumerate(shapes.values())}
    return text + _mm_marks(sorted(ids, key=lambda i: order.get(i, len(order)))), missing


# -- DOT -------------------------------------------------------------------------------------------------------

_DOT_SHAPES: dict[str, dict[str, str]] = {
    "start": {"shape": "circle", "style": "filled", "fillcolor": "#e8f5e9", "color": "#2e7d32"},
    "end": {"shape": "circle", "style": "filled", "fillcolor": "#ffebee", "color": "#b71c1c", "penwidth": "4"},
    "terminate": {"shape": "doublecircle", "style": "filled", "fillcolor": "#212121", "fontcolor": "white",
                  "penwidth": "3"},
    "task": {"shape": "box", "style": "rounded,filled", "fillcolor": "#fffde7"},
    "effect": {"shape": "box", "style": "filled", "peripheries": "2", "fillcolor": "#e3f2fd", "color": "#0d47a1"},
    "call": {"shape": "box", "style": "rounded,filled", "fillcolor": "#fffde7", "penwidth": "4"},
    "gateway": {"shape": "diamond", "style": "filled", "fillcolor": "#fff3e0", "color": "#e65100"},
    "event_gateway": {"shape": "Mdiamond", "style": "filled", "fillcolor": "#fff3e0", "color": "#e65100"},
    "event": {"shape": "doublecircle", "style": "filled", "fillcolor": "#f3e5f5", "color": "#4a148c"},
    "mi_split": {"shape": "trapezium", "style": "filled", "fillcolor": "#e0f2f1"},
    "mi_join": {"shape": "invtrapezium", "style": "filled", "fillcolor": "#e0f2f1"},
    "region": {"shape": "oval", "style": "filled", "fillcolor": "#eceff1"},
    "lock": {"shape": "parallelogram", "style": "filled", "fillcolor": "#fce4ec"},
    "flag": {"shape": "cds", "style": "filled", "fillcolor": "#f1f8e9"},
    "throw": {"shape": "rarrow", "style": "filled", "fillcolor": "#ede7f6"},
    "invalid": {"shape": "octagon", "style": "filled,dashed", "fillcolor": "#ffcdd2", "color": "#b71c1c"},
    "unknown": {"shape": "box", "style": "dotted"},
}

_DOT_CLUSTERS: dict[str, dict[str, str]] = {
    "scope": {"style": "rounded,dashed", "color": "#37474f"},
    "saga": {"style": "rounded", "color": "#1b5e20", "penwidth": "2"},
    "mi": {"style": "rounded", "color": "#004d40", "penwidth": "2"},
    "critical": {"style": "rounded,bold", "color": "#880e4f"},
    "milestone": {"style": "rounded,dotted", "color": "#33691e"},
    "net": {"style": "rounded", "color": "#455a64"},
}

_DOT_EDGES: dict[str, dict[str, str]] = {
    "flow": {},
    "back": {"style": "bold", "color": "#6d4c41", "constraint": "false"},
    "assoc": {"style": "dashed", "color": "#546e7a", "arrowhead": "open"},
}


def _dot_text(text: str) -> str:
    """A double-quoted DOT string: backslashes and quotes escaped, line breaks as \\n."""
    escaped = _clean(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _dot_attrs(attrs: _Mapping[str, str]) -> str:
    return ", ".join(f"{k}={_dot_text(v)}" for k, v in attrs.items())


def to_dot(term: _Term, highlight: Iterable[str] | None = None) -> str:
    """A Graphviz digraph (`digraph workflow {...}`) of `term`; `highlight` marks the shapes at these node paths
    (such as a case's `status().at`).

    Each shape's `tooltip` is its node path. Render with `dot -Tsvg`. Raises TypeError for a non-term, and
    ValueError for a highlighted path the workflow does not have.
    """
    diagram = _Diagram(_check_term(term, "to_dot"))
    marked = _highlighted(diagram, highlight, "to_dot", term)
    lines = [
        "digraph workflow {",
        '    graph [rankdir="LR", fontname="Helvetica", fontsize="11", nodesep="0.3"];',
        '    node [fontname="Helvetica", fontsize="10"];',
        '    edge [fontname="Helvetica", fontsize="9"];',
    ]

    def write_node(node: _Node, pad: str) -> list[str]:
        attrs = {"label": node.label, **_DOT_SHAPES[node.shape], "tooltip": _tooltip(node)}
        if node.id in marked:
            styles = [s for s in attrs.get("style", "").split(",") if s and s != "dotted"]
            attrs.update(style=",".join(dict.fromkeys([*styles, "filled"])), fillcolor="#ffeb3b", color="#d50000",
                         penwidth="4")
        return [f"{pad}{node.id} [{_dot_attrs(attrs)}];"]

    def open_cluster(cluster: _Cluster, pad: str) -> list[str]:
        attrs = {"label": cluster.label, **_DOT_CLUSTERS.get(cluster.kind, {})}
        return [f"{pad}subgraph cluster_{cluster.id} {{", f"{pad}    graph [{_dot_attrs(attrs)}];"]

    lines.extend(_write_nested(diagram, open_cluster, lambda pad: f"{pad}}}", write_node, "    "))
    for e in diagram.sorted_edges():
        attrs = {**({"label": e.label} if e.label else {}), **_DOT_EDGES[e.style]}
        lines.append(f"    {e.src} -> {e.dst}" + (f" [{_dot_attrs(attrs)}];" if attrs else ";"))
    lines.append("}")
    return "\n".join(lines) + "\n"

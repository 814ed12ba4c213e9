"""Nets: the pure graph analysis behind `net(...)`, shared by validation and the compiler.

A net is an unstructured graph: nodes (terms) and edges between them and the reserved `"start"` and `"end"`.
This module normalises a `Net` term into a `Graph` (reporting what is malformed), checks what can be checked
statically, and precomputes what the vm needs to run the net without ever walking the graph:

- **Places.** A token of a net activation is either inside a node (a thread of one of the node's activations is
  in it) or waiting on an edge into an "and" or "or" join. Those are the places. Only the places an OR-join
  can depend on are counted at run time: the nodes that can reach some OR-join ("tracked" nodes, each run in a
  node frame of its own) and the edges into and/or joins. A node that cannot reach any OR-join needs no
  bookkeeping at all: the compiler lays chains of them out back to back, so a thread falls from one node into
  the next like the steps of a `seq`.
- **OR-join reachable sets.** For each OR-join J and each of its incoming edges e, `reach` lists the places from
  which a token can still get onto e by a path that avoids J (a reverse breadth-first search from e's source in
  the graph without J). J may fire when one of its incoming edges holds a token and, for every empty incoming
  edge, no place of its set is occupied. **Edge predicates are ignored**: reachability is structural (BPMN 2.0's
  rule, not YAWL's analysis of what the data allows), so a join may wait for a token that a predicate would
  never send; the net then fires it once nothing else can move.
- **Watchers.** For each place, the OR-joins whose sets contain it. The vm re-checks a join only when one of
  its places empties (or a token arrives on one of its edges), so an ordinary step never scans the net.

Cost. The compiler does one breadth-first search per incoming edge of each OR-join: O(k * (N + E)) time and
O(k * N) space for k incoming edges over a net of N nodes and E edges. At run time a re-check of an OR-join
scans the sets of its empty incoming edges, stopping at the first occupied place: O(N) in the worst case,
paid only when a watched place empties while the join holds a token (`bench/net_bench.py` measures it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._terms import Net

START = "start"
END = "end"
RESERVED = (START, END)
SPLITS = ("and", "xor", "or")
JOINS = ("xor", "and", "or")
DEFAULT_SPLIT = "and"
DEFAULT_JOIN = "xor"


@dataclass(frozen=True)
class Edge:
    index: int  # position in the net's edge list
    src: str
    dst: str
    pred: Callable[..., Any] | None


@dataclass
class Graph:
    """A well-formed net: node names in the order given, their terms, and the edges with their kinds resolved."""

    names: list[str]
    terms: dict[str, Any]
    edges: list[Edge]
    out: dict[str, list[Edge]] = field(default_factory=dict)  # every node, start and end; in edge order
    inn: dict[str, list[Edge]] = field(default_factory=dict)
    split: dict[str, str] = field(default_factory=dict)  # every node and start
    join: dict[str, str] = field(default_factory=dict)  # every node


Problem = tuple[str | None, str]
"""(node name the problem is about, or None for the net itself; message)."""


def _pairs(value: object) -> list[tuple[Any, Any]] | None:
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        return list(value)
    return None


def _show(edge: tuple[Any, ...]) -> str:
    return repr(edge[:2])


def normalise(t: Net) -> tuple[Graph | None, list[Problem]]:
    """The net's graph and its local problems (kinds, predicates on and-split edges); None for the graph when a
    node or an edge is malformed (the reachability checks would only add noise then)."""
    problems: list[Problem] = []
    nodes = _pairs(t.nodes)
    if nodes is None:
        return None, [(None, f"net nodes must be a mapping {{name: term}}, got {t.nodes!r}")]
    if not nodes:
        problems.append((None, "net needs at least one node besides \"start\" and \"end\""))
    names: list[str] = []
    terms: dict[str, Any] = {}
    for name, term in nodes:
        if not isinstance(name, str) or not name:
            problems.append((None, f"net node names must be non-empty str, got {name!r}"))
        elif name in RESERVED:
            problems.append(
                (None, f"node name {name!r} is reserved (every net has \"start\" and \"end\"): rename the node")
            )
        else:
            names.append(name)
            terms[name] = term
    known = set(names) | set(RESERVED)
    listing = ", ".join([*names, *RESERVED])
    edges: list[Edge] = []
    raw_edges = t.edges
    if not isinstance(raw_edges, tuple):
        problems.append((None, f"net edges must be a list of (src, dst) or (src, dst, pred), got {raw_edges!r}"))
        raw_edges = ()
    seen: dict[tuple[str, str], int] = {}
    for raw in raw_edges:
        if not (isinstance(raw, tuple) and len(raw) in (2, 3)):
            problems.append((None, f"edge {raw!r} must be (src, dst) or (src, dst, pred)"))
            continue
        src, dst = raw[0], raw[1]
        pred = raw[2] if len(raw) == 3 else None
        bad = False
        for end_name in (src, dst):
            if not isinstance(end_name, str) or end_name not in known:
                problems.append((None, f"edge {_show(raw)} names unknown node {end_name!r} (nodes: {listing})"))
                bad = True
        if bad:
            continue
        if dst == START:
            problems.append((None, f"edge {_show(raw)} enters \"start\": start has no incoming edges"))
            continue
        if src == END:
            problems.append((None, f"edge {_show(raw)} leaves \"end\": end has no outgoing edges"))
            continue
        if pred is not None and not callable(pred):
            problems.append((None, f"edge {_show(raw)} predicate must be a function of ctx, got {pred!r}"))
        if (src, dst) in seen:
            problems.append((None, f"edge {_show(raw)} is given twice: keep one (a node is started once per edge)"))
            continue
        seen[(src, dst)] = len(edges)
        edges.append(Edge(len(edges), src, dst, pred))
    structural = bool(problems)  # a node or an edge is malformed: the graph is not the one the user meant
    graph = Graph(names, terms, edges)
    graph.out = {n: [] for n in [*names, *RESERVED]}
    graph.inn = {n: [] for n in [*names, *RESERVED]}
    for edge in edges:
        graph.out[edge.src].append(edge)
        graph.inn[edge.dst].append(edge)
    for label, value, kinds, default in (
        ("split", t.split, SPLITS, DEFAULT_SPLIT),
        ("join", t.join, JOINS, DEFAULT_JOIN),
    ):
        given = _pairs(value)
        if given is None:
            problems.append((None, f"{label} must be a mapping {{node: kind}}, got {value!r}"))
            given = []
        resolved = getattr(graph, label)
        for name in [*names, START]:
            resolved[name] = default
        for name, kind in given:
            if kind not in kinds:
                choices = ", ".join(repr(k) for k in kinds[:-1]) + f" or {kinds[-1]!r}"
                problems.append((None, f"{label}={{{name!r}: {kind!r}}} is not a {label} kind: use {choices}"))
                continue
            if not isinstance(name, str) or name not in known:
                problems.append((None, f"{label} names unknown node {name!r} (nodes: {listing})"))
                continue
            _check_kind(graph, label, name, kind, problems)
            if name in resolved:
                resolved[name] = kind
    if structural:
        return None, problems
    for name in [*names, START]:
        if graph.split[name] == "and":
            for edge in graph.out[name]:
                if edge.pred is not None:
                    where = None if name == START else name
                    problems.append(
                        (
                            where,
                            f"edge {(edge.src, edge.dst)!r} has a predicate, but {name!r} is an and split (the "
                            "default), which takes every edge: declare split={"
                            f"{name!r}: 'xor'}} (or 'or'), or drop the predicate",
                        )
                    )
    return graph, problems


def _check_kind(graph: Graph, label: str, name: str, kind: str, problems: list[Problem]) -> None:
    if label == "join" and name == END:
        problems.append((None, "a join is declared on \"end\": every token that reaches end is done; remove it"))
    elif label == "join" and name == START:
        problems.append((None, "a join is declared on \"start\", which has no incoming edges; remove it"))
    elif label == "split" and name == END:
        problems.append((None, "a split is declared on \"end\", which has no outgoing edges; remove it"))
    else:
        count = len(graph.out[name] if label == "split" else graph.inn[name])
        if count < 2:
            side = "outgoing" if label == "split" else "incoming"
            has = "no" if count == 0 else "one"
            where = None if name == START else name
            problems.append(
                (where, f"{label}={kind!r} is given for {name!r}, which has {has} {side} edge: a {label} needs two "
                 "or more; remove it")
            )


def _reach(start: Iterable[str], step: Callable[[str], Iterable[str]], avoid: frozenset[str] = frozenset()) -> set[str]:
    """Every name reachable from `start` (included) by `step`, never entering `avoid`."""
    seen = {s for s in start if s not in avoid}
    todo = deque(seen)
    while todo:
        here = todo.popleft()
        for there in step(here):
            if there not in seen and there not in avoid:
                seen.add(there)
                todo.append(there)
    return seen


def _forward(graph: Graph) -> Callable[[str], list[str]]:
    return lambda n: [e.dst for e in graph.out[n]]


def _backward(graph: Graph) -> Callable[[str], list[str]]:
    return lambda n: [e.src for e in graph.inn[n]]


def check(t: Net) -> list[Problem]:
    """Every problem `validate` reports for a net (besides those of its node terms)."""
    graph, problems = normalise(t)
    if graph is None:
        return problems
    from_start = _reach([START], _forward(graph))
    to_end = _reach([END], _backward(graph))
    for name in graph.names:
        if name not in from_start:
            problems.append((name, f"node {name!r} is unreachable from start: add an edge into it, or remove it"))
        elif name not in to_end:
            problems.append((name, f"node {name!r} has no path to end: add an edge from it (or after it) to end"))
    problems.extend(_xor_fed_and_joins(graph))
    return problems


def _xor_fed_and_joins(graph: Graph) -> list[Problem]:
    """An and-join fed by two edges of one xor split: e1 reaches an incoming edge of the join that e2 cannot, and
    e2 one that e1 cannot (paths that avoid the split and the join). Only one edge of the split gets the token,
    so the join would wait for the other forever."""
    problems: list[Problem] = []
    ands = [n for n in graph.names if graph.join[n] == "and"]
    xors = [n for n in [START, *graph.names] if graph.split[n] == "xor" and len(graph.out[n]) > 1]
    forward = _forward(graph)
    for join in ands:
        incoming = graph.inn[join]
        for split in xors:
            fed: list[tuple[Edge, set[int]]] = []
            for edge in graph.out[split]:
                if edge.dst == join:
                    fed.append((edge, {edge.index}))
                    continue
                seen = _reach([edge.dst], forward, frozenset({split, join}))
                fed.append((edge, {f.index for f in incoming if f.src in seen}))
            pair = _exclusive(fed)
            if pair is not None:
                a, b = pair
                problems.append(
                    (
                        join,
                        f"the and-join {join!r} is fed by two edges of the xor split {split!r} (to {a.dst!r} and "
                        f"{b.dst!r}): only one of them gets the token, so the join would wait for the other "
                        f"forever; make {join!r} an or join, or {split!r} an and/or split",
                    )
                )
                break
    return problems


def _exclusive(fed: list[tuple[Edge, set[int]]]) -> tuple[Edge, Edge] | None:
    for i, (a, reach_a) in enumerate(fed):
        for b, reach_b in fed[i + 1 :]:
            if reach_a - reach_b and reach_b - reach_a:
                return a, b
    return None


# -- what the compiler precomputes ------------------------------------------------------------------------------


@dataclass
class Plan:
    """Everything the compiler needs about a valid net, by node index (the order of `graph.names`)."""

    graph: Graph
    index: dict[str, int]
    layout: list[int]  # node indexes in code order: chains of plain successors back to back
    plain: list[int]  # per node: the node its thread falls or jumps into without routing, or -1
    place_of: list[int]  # per node: its place if it is tracked (can reach an OR-join), else -1
    edge_place: dict[int, int]  # edge index -> place, for edges into and/or joins
    places: int
    reach: dict[int, list[tuple[int, ...]]]  # OR-join -> per incoming edge (in edge order), its places
    watch: list[tuple[int, ...]]  # per place: the OR-joins to re-check when it empties


def plan(t: Net) -> Plan:
    """Precompute the layout, places, OR-join reachable sets and watchers of a valid net."""
    graph, problems = normalise(t)
    assert graph is not None, "plan() runs on a validated net"
    assert not problems, "plan() runs on a validated net"
    index = {name: i for i, name in enumerate(graph.names)}
    ors = [n for n in graph.names if graph.join[n] == "or"]
    backward = _backward(graph)
    sets: dict[str, list[set[str]]] = {}
    tracked: set[str] = set()
    for join in ors:
        per_edge = []
        for edge in graph.inn[join]:
            found = _reach([edge.src], backward, frozenset({join, START}))
            per_edge.append(found)
            tracked |= found
        sets[join] = per_edge
    # the places: tracked nodes first, in node order, then the edges into and/or joins, in edge order
    place_of = [-1] * len(graph.names)
    places = 0
    for name in graph.names:
        if name in tracked:
            place_of[index[name]] = places
            places += 1
    edge_place: dict[int, int] = {}
    for edge in graph.edges:
        if edge.dst != END and graph.join[edge.dst] != "xor":
            edge_place[edge.index] = places
            places += 1
    reach: dict[int, list[tuple[int, ...]]] = {}
    watchers: list[list[int]] = [[] for _ in range(places)]
    for join in ors:
        j = index[join]
        reach[j] = []
        for found in sets[join]:
            mine = [place_of[index[n]] for n in graph.names if n in found]  # in node order
            mine += [edge_place[e.index] for e in graph.edges if e.index in edge_place and e.dst in found]
            reach[j].append(tuple(mine))
            for p in mine:
                watchers[p].append(j)
    plain = [-1] * len(graph.names)
    for name in graph.names:
        out = graph.out[name]
        if place_of[index[name]] < 0 and len(out) == 1 and out[0].pred is None:
            dst = out[0].dst
            if dst != END and graph.join[dst] == "xor":
                plain[index[name]] = index[dst]
    return Plan(
        graph, index, _layout(graph, index, plain), plain, place_of, edge_place, places, reach,
        [tuple(sorted(set(w))) for w in watchers],
    )


def _layout(graph: Graph, index: dict[str, int], plain: list[int]) -> list[int]:
    """Nodes in code order: depth-first from start in edge order, each followed by its plain successor when that
    one is not placed yet (so a chain of plain nodes runs without a jump)."""
    placed: list[int] = []
    done = [False] * len(graph.names)
    order: list[int] = []
    seen = set()
    stack = [START]
    while stack:  # depth-first visiting order, edges in the order given
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name != START and name != END:
            order.append(index[name])
        stack.extend(e.dst for e in reversed(graph.out[name]))
    visited = set(order)
    order += [i for i in range(len(graph.names)) if i not in visited]
    for first in order:
        i = first
        while i >= 0 and not done[i]:
            done[i] = True
            placed.append(i)
            i = plain[i]
    return placed

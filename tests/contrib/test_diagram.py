"""Diagrams: `wfsub.to_mermaid` and `wfsub.to_dot`.

Every output is checked by a parser: DOT by pydot (a real DOT parser), Mermaid by `parse_mermaid` below, a
strict reader of the flowchart subset the drawer writes (every line known, ids valid and unique, every edge and
class between declared nodes, subgraphs balanced). Both formats come from one graph, so `draw` also checks that
they agree node for node and edge for edge; the tests then read the shapes by their node paths.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydot
import pytest

import wfsub
from tests.harness import running
from wfsub import (
    Retry,
    add_instances,
    call,
    cancel_region,
    close_instances,
    complete_region,
    critical,
    defer,
    effect,
    interleave,
    loop,
    mi,
    milestone,
    multi_choice,
    net,
    par,
    saga,
    scope,
    seq,
    sleep,
    task,
    terminate,
    to_dot,
    to_mermaid,
    validate,
    wait,
    when_milestone,
    xor,
)
from wfsub import _diagram as diagram
from wfsub._terms import MI, Defer, Effect, Interleave, Loop, Par, Saga, Scope, Seq, Task, Term, Wait, Xor, term_classes
from wfsub.lowlevel import drawing_of, mark_drawing

# -- the workflow pieces ---------------------------------------------------------------------------------------


def price(ctx: Any) -> None:
    return None


def approve(ctx: Any) -> None:
    return None


def big(ctx: Any) -> bool:
    return True


def small(ctx: Any) -> bool:
    return False


def more(ctx: Any) -> bool:
    return False


async def charge(ctx: Any) -> None:
    return None


async def refund(ctx: Any) -> None:
    return None


def t(name: str) -> Term:
    return task(price, name=name)


EVERYTHING = seq(
    t("start"),
    scope(
        "outer",
        par(
            interleave(critical("L", seq(t("a"), effect(charge, name="fx"))), t("b"), order=[(0, "b")]),
            mi(seq(wait("go"), t("m")), count=2, join=1, name="many", collect="outs"),
            loop(t("l"), times=2),
            multi_choice((big, milestone("M", wait("ms"))), (small, when_milestone("M", t("w")))),
            xor((big, call("sub")), default=t("x")),
            defer({"d": t("d")}, timeout=5, on_timeout=t("late")),
            scope("err", saga((t("s1"), t("c1")), t("s2")), on_error=t("handled"), on_cancel=t("undo")),
            seq(sleep(3), cancel_region("many"), complete_region("err"), terminate()),
            mi(t("dyn"), items=lambda c: [], dynamic=True, name="dyn"),
            seq(add_instances("dyn", items=lambda c: [1]), close_instances("dyn")),
        ),
    ),
    t("end"),
)


# -- reading Mermaid -------------------------------------------------------------------------------------------

ID = r"[A-Za-z_][A-Za-z0-9_]*"
SHAPES = {  # opening -> the closings that go with it, longest opening first
    "(((": {")))"}, "((": {"))"}, "([": {"])"}, "[[": {"]]"}, "{{": {"}}"}, "[/": {"/]", "\\]"},
    "[\\": {"\\]", "/]"}, "(": {")"}, "[": {"]"}, "{": {"}"}, ">": {"]"},
}
SHAPE_OF = {  # what each shape kind of the drawer looks like in Mermaid
    "(((": "event", "((": "circle", "([": "stadium", "[[": "subroutine", "{{": "hexagon", "[/": "slanted",
    "[\\": "slanted-back", "(": "rounded", "[": "rect", "{": "diamond", ">": "flag",
}
MM_ENTITIES = {"#quot;": '"', "#35;": "#", "#amp;": "&", "#lt;": "<", "#gt;": ">", "#124;": "|", "#96;": "`",
               "#37;": "%", "<br>": "\n"}
NODE = re.compile(
    rf'^(?P<id>{ID})(?P<open>{"|".join(re.escape(k) for k in SHAPES)})"(?P<label>[^"]*)"(?P<close>[)\]}}/\\]+)$'
)
EDGE = re.compile(rf'^(?P<src>{ID}) (?P<arrow>-->|==>|-\.->)(?:\|"(?P<label>[^"]*)"\|)? (?P<dst>{ID})$')


def mm_decode(text: str) -> str:
    assert not re.search(r"[<>&|`%]", re.sub("<br>", "", text)), f"unescaped syntax in a Mermaid label: {text!r}"
    return re.sub("|".join(re.escape(k) for k in MM_ENTITIES), lambda m: MM_ENTITIES[m.group(0)], text)


@dataclass
class Graph:
    """One diagram, as read back from either format."""

    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {label, shape, cluster, path}
    edges: list[tuple[str, str, str | None, str]] = field(default_factory=list)  # (src, dst, label, style)
    clusters: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # id -> (label, parent id)
    marked: set[str] = field(default_factory=set)  # highlighted node ids

    def at(self, path: str, part: str | None = None) -> str:
        """The id of the shape standing for the term at `path` (or of that part of it: "join", "error", ...)."""
        found = [i for i, n in self.nodes.items() if n["path"] == path and n["part"] == part]
        assert len(found) == 1, (path, part, found)
        return found[0]

    def label(self, path: str) -> str:
        return str(self.nodes[self.at(path)]["label"])

    def out(self, nid: str, style: str | None = None) -> list[tuple[str, str | None]]:
        return [(d, lab) for s, d, lab, st in self.edges if s == nid and (style is None or st == style)]

    def into(self, nid: str, style: str | None = None) -> list[tuple[str, str | None]]:
        return [(s, lab) for s, d, lab, st in self.edges if d == nid and (style is None or st == style)]

    def labelled(self, label: str) -> list[str]:
        return [i for i, n in self.nodes.items() if n["label"] == label]

    def cluster_of(self, nid: str) -> str | None:
        return self.nodes[nid]["cluster"]

    def inside(self, nid: str, cluster: str) -> bool:
        """Is the node in `cluster` or in a cluster nested in it?"""
        here = self.cluster_of(nid)
        while here is not None:
            if here == cluster:
                return True
            here = self.clusters[here][1]
        return False


def split_part(text: str) -> tuple[str | None, str | None]:
    """(node path, part) from a shape's path note: 'par (join)' is the join part of the par; 'start' and 'end'
    are the events, which stand for no term."""
    if text in ("start", "end"):
        return None, text
    m = re.fullmatch(r"(.*) \((\w+)\)", text, re.DOTALL)
    return (m.group(1), m.group(2)) if m else (text, None)


def parse_mermaid(text: str) -> Graph:
    """Read a flowchart the drawer wrote; fail on anything outside the subset it writes or any dangling id."""
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    g = Graph()
    stack: list[str] = []
    path: str | None = None
    classes: dict[str, set[str]] = {}
    defined: set[str] = set()
    links: list[int] = []
    for raw in lines[1:]:
        line = raw.strip()
        if m := re.fullmatch(rf"%% ({ID}): (.*)", line):
            path, next_id = m.group(2).replace("%25", "%"), m.group(1)  # (a `%` is written %25)
        elif line.startswith("%%"):
            continue
        elif m := re.fullmatch(rf'subgraph ({ID}) \["([^"]*)"\]', line):
            assert m.group(1) not in g.clusters and m.group(1) not in g.nodes, f"duplicate id {m.group(1)}"
            g.clusters[m.group(1)] = (mm_decode(m.group(2)), stack[-1] if stack else None)
            stack.append(m.group(1))
        elif line == "end":
            assert stack, "an 'end' without its subgraph"
            stack.pop()
        elif m := NODE.fullmatch(line):
            nid, opening, closing = m.group("id"), m.group("open"), m.group("close")
            assert closing in SHAPES[opening], f"{nid}: {opening!r} closed by {closing!r}"
            assert nid not in g.nodes and nid not in g.clusters, f"duplicate id {nid}"
            assert nid not in ("end", "graph", "subgraph"), f"{nid} is a Mermaid keyword"
            assert path is not None and next_id == nid, f"{nid} has no '%% {nid}: <path>' comment before it"
            where, part = split_part(path)
            g.nodes[nid] = {
                "label": mm_decode(m.group("label")),
                "shape": SHAPE_OF[opening],
                "cluster": stack[-1] if stack else None,
                "path": where,
                "part": part,
            }
            path = None
        elif m := EDGE.fullmatch(line):
            assert not stack, "edges are written after every subgraph has closed"
            for end in (m.group("src"), m.group("dst")):
                assert end in g.nodes, f"edge to undeclared node {end}: {line}"
            style = {"-->": "flow", "==>": "back", "-.->": "assoc"}[m.group("arrow")]
            label = mm_decode(m.group("label")) if m.group("label") is not None else None
            g.edges.append((m.group("src"), m.group("dst"), label, style))
        elif m := re.fullmatch(r"classDef (\w+) (\S.*)", line):
            defined.add(m.group(1))
        elif m := re.fullmatch(rf"class ({ID}(?:,{ID})*) (\w+)", line):
            ids = m.group(1).split(",")
            assert all(i in g.nodes for i in ids), f"class of undeclared nodes: {line}"
            assert m.group(2) in defined, f"class {m.group(2)} used before its classDef"
            classes.setdefault(m.group(2), set()).update(ids)
        elif m := re.fullmatch(r"linkStyle (\d+(?:,\d+)*) (\S.*)", line):
            links.extend(int(i) for i in m.group(1).split(","))
        else:
            raise AssertionError(f"a line the drawer should not write: {raw!r}")
    assert not stack, f"subgraphs left open: {stack}"
    assert all(0 <= i < len(g.edges) for i in links), "linkStyle names an edge that does not exist"
    assert set(g.nodes) == set().union(*classes.values()) - set(), "every node has a style class"
    g.marked = classes.get("highlight", set())
    return g


# -- reading DOT -------------------------------------------------------------------------------------------------


def unquote(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value)
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append("\n" if nxt == "n" else nxt)
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_dot(text: str) -> Graph:
    """Parse with pydot; read nodes (with their cluster), clusters and edges back."""
    assert text.startswith("digraph workflow {")
    with warnings.catch_warnings():  # pydot 4.0 calls pyparsing 3.3's deprecated camelCase names
        warnings.filterwarnings("ignore", "'\\w+' deprecated - use", DeprecationWarning)
        parsed = pydot.graph_from_dot_data(text)
    assert parsed is not None and len(parsed) == 1, "pydot could not parse the DOT output"
    root = parsed[0]
    g = Graph()
    todo: list[tuple[Any, str | None]] = [(root, None)]
    while todo:
        graph, cluster = todo.pop()
        for node in graph.get_nodes():
            name = node.get_name().strip('"')
            if name in ("node", "edge", "graph"):
                continue
            assert name not in g.nodes, f"duplicate node {name}"
            attrs = node.get_attributes()
            where, part = split_part(unquote(attrs.get("tooltip")) or "")
            g.nodes[name] = {
                "label": unquote(attrs.get("label")),
                "shape": unquote(attrs.get("shape")),
                "cluster": cluster,
                "path": where,
                "part": part,
                "attrs": {k: unquote(v) for k, v in attrs.items()},
            }
            if unquote(attrs.get("fillcolor")) == "#ffeb3b":
                g.marked.add(name)
        for sub in graph.get_subgraphs():
            name = sub.get_name().strip('"')
            assert name.startswith("cluster_"), name
            cid = name.removeprefix("cluster_")
            g.clusters[cid] = (_graph_attr(sub, "label"), cluster)
            todo.append((sub, cid))
    for edge in root.get_edges():
        src, dst = edge.get_source().strip('"'), edge.get_destination().strip('"')
        assert src in g.nodes and dst in g.nodes, f"edge between undeclared nodes {src} -> {dst}"
        attrs = edge.get_attributes()
        style = {None: "flow", "bold": "back", "dashed": "assoc"}[unquote(attrs.get("style"))]
        g.edges.append((src, dst, unquote(attrs.get("label")), style))
    return g


def _graph_attr(graph: Any, name: str) -> str:
    """A `graph [name=...]` attribute statement inside a (sub)graph, as pydot keeps it."""
    for node in graph.get_nodes():
        if node.get_name() == "graph" and name in node.get_attributes():
            return str(unquote(node.get_attributes()[name]))
    raise AssertionError(f"{graph.get_name()} has no graph attribute {name}")


def draw(term: Term, highlight: Any = None) -> tuple[Graph, Graph]:
    """Both diagrams of `term`, parsed; they must hold the same nodes, paths, labels, clusters and edges.

    Parsed once per (term, highlight) in this module: pydot's parser takes about a second for EVERYTHING, and the
    tests only read the graphs.
    """
    return _draw(term, highlight if highlight is None or isinstance(highlight, str) else tuple(highlight))


@functools.lru_cache(maxsize=64)
def _draw(term: Term, highlight: Any) -> tuple[Graph, Graph]:
    mm = parse_mermaid(to_mermaid(term, highlight))
    dot = parse_dot(to_dot(term, highlight))
    assert set(mm.nodes) == set(dot.nodes)
    for nid, node in mm.nodes.items():
        other = dot.nodes[nid]
        assert (node["label"], node["part"], node["cluster"]) == (other["label"], other["part"], other["cluster"])
        assert node["path"] == (other["path"].replace("\n", " ") if other["path"] else None)  # comments are 1 line
    assert Counter(mm.edges) == Counter(dot.edges)
    assert mm.clusters == dot.clusters
    assert mm.marked == dot.marked
    return mm, dot


# -- the formats -------------------------------------------------------------------------------------------------


def test_outputs_start_with_their_format_keyword_and_are_exported_by_wfsub() -> None:
    """to_mermaid returns a `flowchart`, to_dot a `digraph`; both are wfsub's own names."""
    assert wfsub.to_mermaid is diagram.to_mermaid and wfsub.to_dot is diagram.to_dot
    assert to_mermaid(t("a")).startswith("flowchart")
    assert to_dot(t("a")).startswith("digraph")


def test_a_workflow_runs_from_a_start_event_to_an_end_event() -> None:
    """A seq is drawn as a chain from the start event (circle) to the end event (thick circle)."""
    mm, dot = draw(seq(t("a"), t("b"), t("c")))
    a, b, c = (mm.at(f"seq[{i}].task") for i in range(3))
    assert mm.out("wf_start") == [(a, None)] and mm.out(a) == [(b, None)] and mm.out(b) == [(c, None)]
    assert mm.out(c) == [("wf_end", None)]
    assert mm.nodes["wf_start"]["shape"] == mm.nodes["wf_end"]["shape"] == "circle"
    assert dot.nodes["wf_end"]["attrs"]["penwidth"] == "4"


def test_tasks_are_labelled_by_name_or_function_and_effects_have_a_double_border_and_their_policy() -> None:
    """A task shows its name or function name; an effect has a double border and notes its timeout and retry."""
    mm, dot = draw(seq(task(price), t("named"), effect(charge, timeout=5, retry=Retry(max_attempts=3))))
    assert mm.label("seq[0].task") == "price" and mm.label("seq[1].task") == "named"
    assert mm.label("seq[2].effect") == "effect: charge\ntimeout 5s, retry ×3"
    assert mm.nodes[mm.at("seq[2].effect")]["shape"] == "subroutine"  # Mermaid's double-sided box
    assert dot.nodes[dot.at("seq[2].effect")]["attrs"]["peripheries"] == "2"
    assert dot.nodes[dot.at("seq[0].task")]["attrs"].get("peripheries") is None


@pytest.mark.parametrize(
    ("join", "label"),
    [("all", "AND"), ("first", "1-of-3"), (2, "2-of-3"), ("each", "multi-merge (each)")],
)
def test_par_is_an_and_split_with_a_join_gateway_named_by_its_policy(join: Any, label: str) -> None:
    """par draws an AND split to every branch and a join labelled AND / 1-of-m / n-of-m / multi-merge."""
    mm, _ = draw(par(t("a"), t("b"), t("c"), join=join))
    split = mm.at("par")
    assert mm.label("par") == "AND" and mm.nodes[split]["shape"] == "diamond"
    branches = {mm.at(f"par[{i}].task") for i in range(3)}
    assert {d for d, _ in mm.out(split)} == branches and len(mm.out(split)) == 3
    join_id = mm.at("par", "join")
    assert mm.nodes[join_id]["label"] == label and mm.nodes[join_id]["shape"] == "diamond"
    assert {s for s, _ in mm.into(join_id)} == branches and len(mm.into(join_id)) == 3
    assert mm.out(join_id) == [("wf_end", None)]


def test_par_join_notes_cancel_remaining_and_blocking() -> None:
    """The join of a par says when it withdraws the rest and when it blocks."""
    mm, _ = draw(par(t("a"), t("b"), join="first", cancel_remaining=True, blocking=True))
    assert mm.nodes[mm.at("par", "join")]["label"] == "1-of-2\ncancel remaining\nblocking"


def test_xor_and_multi_choice_label_each_branch_with_its_predicate() -> None:
    """xor draws XOR split/merge, multi_choice OR split/join; their edges name the predicates and the default."""
    mm, _ = draw(seq(xor((big, t("a")), (small, t("b")), default=t("c")), multi_choice((big, t("d")), (more, t("e")))))
    x = mm.at("seq[0].xor")
    assert mm.label("seq[0].xor") == "XOR"
    assert sorted(mm.out(x)) == sorted(
        [(mm.at("seq[0].xor[0].task"), "big"), (mm.at("seq[0].xor[1].task"), "small"),
         (mm.at("seq[0].xor[default].task"), "default")]
    )
    (merge,) = {d for s, d, _, _ in mm.edges if s == mm.at("seq[0].xor[0].task")}
    assert mm.nodes[merge]["label"] == "XOR" and len(mm.into(merge)) == 3
    o = mm.at("seq[1].multi_choice")
    assert mm.label("seq[1].multi_choice") == "OR"
    assert sorted(lab for _, lab in mm.out(o)) == ["big", "more"]
    (join,) = {d for s, d, _, _ in mm.edges if s == mm.at("seq[1].multi_choice[0].task")}
    assert mm.nodes[join]["label"] == "OR" and len(mm.into(join)) == 2


def test_defer_is_an_event_based_gateway_with_a_signal_event_per_branch_and_a_timer() -> None:
    """defer draws an event-based gateway, one signal event per branch, and its timeout as a timer event."""
    mm, dot = draw(defer({"accept": t("book"), "decline": t("close")}, timeout=60, on_timeout=t("expire")))
    gate = mm.at("defer")
    assert mm.nodes[gate]["shape"] == "hexagon" and dot.nodes[gate]["shape"] == "Mdiamond"
    assert mm.label("defer") == "event-based\n(defer)\ntimeout 60s"
    events = {mm.nodes[d]["label"]: d for d, _ in mm.out(gate)}
    assert set(events) == {"signal: accept", "signal: decline", "timer: 60s"}
    assert all(mm.nodes[e]["shape"] == "event" for e in events.values())
    assert mm.out(events["signal: accept"]) == [(mm.at("defer[accept].task"), None)]
    assert mm.out(events["timer: 60s"]) == [(mm.at("defer[timeout].task"), None)]
    (merge,) = {d for d, _ in mm.out(mm.at("defer[accept].task"))}
    assert mm.nodes[merge]["label"] == "XOR" and len(mm.into(merge)) == 3


@pytest.mark.parametrize(
    ("kwargs", "cond"), [({"while_": big}, "while big"), ({"until": big}, "until big"), ({"times": 3}, "×3")]
)
def test_loop_draws_a_back_edge_labelled_with_its_condition(kwargs: dict[str, Any], cond: str) -> None:
    """A loop has exactly one back edge (thick in Mermaid, bold in DOT), labelled with the loop's condition."""
    mm, _ = draw(loop(t("body"), max_iterations=10, **kwargs))
    backs = [e for e in mm.edges if e[3] == "back"]
    assert len(backs) == 1 and backs[0][2] == f"again ({cond})"
    test, body = mm.at("loop"), mm.at("loop.task")
    assert mm.label("loop") == f"loop {cond}\nmax 10"
    assert mm.into("wf_end") == [(test, "done")]
    if "until" in kwargs:  # post-test: a merge gateway, the body, then the test that loops back to the merge
        (merge,) = [d for d, _ in mm.out("wf_start")]
        assert mm.out(merge) == [(body, None)] and mm.out(body) == [(test, None)]
        assert backs[0][:2] == (test, merge)
    else:  # pre-test: the test gateway, then the body, which loops back to it
        assert mm.out("wf_start") == [(test, None)] and (body, None) in mm.out(test)
        assert backs[0][:2] == (body, test)


def test_mi_is_a_cluster_between_an_mi_marker_and_its_join() -> None:
    """mi draws a cluster holding an MI split (|||, count or items, dynamic) and an MI join with its policy."""
    mm, dot = draw(
        seq(
            mi(t("review"), count=3, join=2, name="reviews", collect="out"),
            mi(t("each"), items=lambda c: [], dynamic=True, join=None),
        )
    )
    head = mm.at("seq[0].mi")
    assert mm.label("seq[0].mi") == "MI |||\ncount: 3"
    assert mm.clusters[mm.cluster_of(head) or ""][0] == "mi reviews"
    (join,) = [n for n in mm.nodes if n.startswith(head + "_")]
    assert mm.nodes[join]["label"] == "MI join: 2 done\ncancel remaining\ncollect into out"
    assert mm.out(head) == [(mm.at("seq[0].mi.task"), None)] and mm.out(mm.at("seq[0].mi.task")) == [(join, None)]
    assert mm.inside(mm.at("seq[0].mi.task"), mm.cluster_of(head) or "")
    assert mm.label("seq[1].mi") == "MI |||\nitems: <lambda>\ndynamic"
    assert [mm.nodes[n]["label"] for n in mm.nodes if n.startswith(mm.at("seq[1].mi") + "_")] == ["MI: no join"]
    assert dot.nodes[head]["shape"] == "trapezium" and dot.nodes[join]["shape"] == "invtrapezium"


def test_wait_and_sleep_are_intermediate_events() -> None:
    """wait is a signal event (with into, timeout, transient), sleep a timer event; both double circles."""
    mm, dot = draw(seq(wait("approved", into="approval", timeout=30, transient=True), sleep(3600)))
    assert mm.label("seq[0].wait") == "signal: approved\ninto approval\ntimeout 30s\ntransient"
    assert mm.label("seq[1].sleep") == "timer: 3600s"
    for path in ("seq[0].wait", "seq[1].sleep"):
        assert mm.nodes[mm.at(path)]["shape"] == "event" and dot.nodes[dot.at(path)]["shape"] == "doublecircle"


def test_scope_is_a_cluster_with_dashed_error_and_cancel_paths() -> None:
    """A scope is a cluster; on_error and on_cancel leave it through boundary events on dashed edges."""
    term = seq(scope("pay", effect(charge), on_error=t("handle"), on_cancel=effect(refund), error_into="why"), t("n"))
    mm, _ = draw(term)
    head = mm.at("seq[0].scope")
    cluster = mm.cluster_of(head)
    assert cluster is not None and mm.clusters[cluster][0] == "scope pay"
    dashed = {lab: d for d, lab in mm.out(head, "assoc")}
    assert set(dashed) == {"on_error", "on_cancel"}
    assert mm.nodes[dashed["on_error"]]["label"] == "error\n→ data['why']"
    assert mm.nodes[dashed["on_cancel"]]["label"] == "cancelled"
    assert mm.out(dashed["on_error"]) == [(mm.at("seq[0].scope[on_error].task"), None)]
    assert mm.out(dashed["on_cancel"]) == [(mm.at("seq[0].scope[on_cancel].effect"), None)]
    after = mm.at("seq[1].task")
    assert {s for s, _ in mm.into(after)} == {
        mm.at("seq[0].scope.effect"), mm.at("seq[0].scope[on_error].task"), mm.at("seq[0].scope[on_cancel].effect")
    }
    for path in ("seq[0].scope.effect", "seq[0].scope[on_error].task", "seq[0].scope[on_cancel].effect"):
        assert mm.inside(mm.at(path), cluster)
    assert not mm.inside(after, cluster)


def test_saga_is_a_cluster_whose_steps_hang_their_compensations_on_dashed_edges() -> None:
    """Each saga step with a compensation has a dashed 'compensate' edge to it; compensations chain in reverse."""
    mm, _ = draw(saga((t("book"), t("unbook")), t("note"), (effect(charge), effect(refund))))
    head = mm.at("saga")
    assert mm.clusters[mm.cluster_of(head) or ""][0] == "saga"
    book, note, pay = mm.at("saga[0].task"), mm.at("saga[1].task"), mm.at("saga[2].effect")
    unbook, refund_ = mm.at("saga[0.compensation].task"), mm.at("saga[2.compensation].effect")
    assert mm.out(head) == [(book, None)] and mm.out(book, "flow") == [(note, None)] and mm.out(note) == [(pay, None)]
    assert mm.out(book, "assoc") == [(unbook, "compensate")]
    assert mm.out(pay, "assoc") == [(refund_, "compensate")]
    assert mm.out(refund_) == [(unbook, "then")]  # compensations run in reverse step order
    assert mm.out(unbook) == []
    assert len([e for e in mm.edges if e[3] == "assoc"]) == 3


def test_interleave_critical_milestone_call_terminate_and_region_steps_each_have_their_own_shape() -> None:
    """The remaining constructs draw as distinct shapes with readable labels, linked by name where they act."""
    mm, dot = draw(EVERYTHING)
    p = "seq[1].scope.par"
    inter = mm.at(f"{p}[0].interleave")
    assert mm.label(f"{p}[0].interleave") == "interleave\n(one at a time)"
    assert mm.out(mm.at(f"{p}[0].interleave[0].critical"), "assoc") == [(mm.at(f"{p}[0].interleave[1].task"), "before")]
    assert len(mm.out(inter)) == 2
    lock = mm.at(f"{p}[0].interleave[0].critical")
    assert mm.label(f"{p}[0].interleave[0].critical") == "lock L\n(one at a time)"
    assert mm.clusters[mm.cluster_of(lock) or ""][0] == "critical L" and dot.nodes[lock]["shape"] == "parallelogram"
    flag = mm.at(f"{p}[3].multi_choice[0].milestone")
    guard = mm.at(f"{p}[3].multi_choice[1].when_milestone")
    assert mm.clusters[mm.cluster_of(flag) or ""][0] == "milestone M"
    assert mm.out(flag, "assoc") == [(guard, "enables")]
    assert mm.label(f"{p}[3].multi_choice[1].when_milestone") == "when milestone\nM"
    assert mm.label(f"{p}[4].xor[0].call") == "call sub"
    assert dot.nodes[dot.at(f"{p}[4].xor[0].call")]["attrs"]["penwidth"] == "4"
    end = mm.at(f"{p}[7].seq[3].terminate")
    assert mm.label(f"{p}[7].seq[3].terminate") == "terminate" and mm.out(end) == []
    assert dot.nodes[end]["shape"] == "doublecircle" and dot.nodes[end]["attrs"]["fillcolor"] == "#212121"
    steps = {
        f"{p}[7].seq[1].cancel_region": ("cancel region many", "cancels", f"{p}[1].mi"),
        f"{p}[7].seq[2].complete_region": ("complete region err", "completes", f"{p}[6].scope"),
        f"{p}[9].seq[0].add_instances": ("add instances to dyn\nitems: <lambda>", "adds to", f"{p}[8].mi"),
        f"{p}[9].seq[1].close_instances": ("close instances of dyn", "closes", f"{p}[8].mi"),
    }
    for path, (label, verb, region) in steps.items():
        assert mm.label(path) == label
        assert mm.nodes[mm.at(path)]["shape"] == "flag" and dot.nodes[dot.at(path)]["shape"] == "rarrow"
        assert mm.out(mm.at(path), "assoc") == [(mm.at(region), verb)]


def test_every_term_kind_has_its_own_drawer() -> None:
    """Each term class of the algebra has a drawer (a kind without one would fall back to a plain box)."""
    assert {cls.kind for cls in term_classes()} <= set(diagram._DRAWERS)


def _approved(ctx: Any) -> bool:
    return True


def _rejected(ctx: Any) -> bool:
    return False


def test_a_net_is_drawn_as_its_graph_with_predicates_and_gateways() -> None:
    """A net draws its nodes' terms, predicate-labelled edges, and split/join gateways at fan-out/fan-in nodes."""
    def f(ctx: Any) -> None:
        return None

    term = net(
        {"check": task(f, name="check"), "fix": task(f, name="fix"), "ship": task(f, name="ship"),
         "log": task(f, name="audit")},
        [("start", "check"), ("check", "fix", _rejected), ("check", "ship", _approved), ("fix", "check"),
         ("check", "log"), ("ship", "end"), ("log", "end")],
        split={"check": "or"}, join={"check": "xor"},
    )
    assert validate(term) == []
    mm, dot = parse_mermaid(to_mermaid(term)), parse_dot(to_dot(term))
    assert set(mm.nodes) == set(dot.nodes) and Counter(mm.edges) == Counter(dot.edges)
    check, fix, ship = mm.at("net[check].task"), mm.at("net[fix].task"), mm.at("net[ship].task")
    assert mm.label("net[log].task") == "log: audit"  # the node's name, when its term is named otherwise
    (split,) = [d for d, _ in mm.out(check)]
    assert mm.nodes[split]["label"] == "OR"
    assert sorted(mm.out(split), key=str) == sorted(
        [(fix, "_rejected"), (ship, "_approved"), (mm.at("net[log].task"), None)], key=str
    )
    (join,) = [s for s, _ in mm.into(check)]
    assert mm.nodes[join]["label"] == "XOR"
    assert sorted(s for s, _ in mm.into(join)) == sorted([mm.at("net"), fix])
    assert {s for s, _ in mm.into("wf_end")} == {ship, mm.at("net[log].task")}
    assert mm.clusters[mm.cluster_of(check) or ""][0] == "net"


# -- paths and highlight ----------------------------------------------------------------------------------------


def _all_paths(term: Term) -> set[str]:
    """Every node path, computed the way validate() does."""
    from wfsub._terms import child_path, children

    out, stack = set(), [(term, term.kind)]
    while stack:
        node, path = stack.pop()
        out.add(path)
        if isinstance(node, Term):
            stack.extend((c, child_path(path, s, c)) for s, c in children(node))
    return out


def test_every_node_path_has_exactly_one_shape() -> None:
    """Each term's node path (as validate() computes it) names exactly one shape, in both formats."""
    mm, dot = draw(EVERYTHING)
    paths = _all_paths(EVERYTHING) - {p for p in _all_paths(EVERYTHING) if p.endswith(".seq") or p == "seq"}
    for graph in (mm, dot):
        drawn = Counter(n["path"] for n in graph.nodes.values() if n["path"] is not None and n["part"] is None)
        assert set(drawn) == paths and set(drawn.values()) == {1}


def test_validation_issue_paths_can_be_highlighted() -> None:
    """The paths validate() reports are diagram paths: an invalid workflow draws with its faulty nodes marked."""
    term = seq(task(charge), par(effect(price), wait("w", timeout=-1)), loop(t("x")))
    issues = validate(term)
    paths = sorted({i.path for i in issues})
    assert paths == ["seq[0].task", "seq[1].par[0].effect", "seq[1].par[1].wait", "seq[2].loop"]
    mm, dot = draw(term, highlight=paths)
    assert mm.marked == {mm.at(p) for p in paths} == dot.marked


def test_highlight_marks_exactly_the_given_paths() -> None:
    """highlight= gives the shapes of those paths the highlight style (Mermaid class, DOT fill), and no other."""
    paths = ["seq[1].scope.par[1].mi.seq[0].wait", "seq[1].scope.par[5].defer", "seq[1].scope.par[6].scope"]
    mm, dot = draw(EVERYTHING, highlight=tuple(paths))
    assert parse_mermaid(to_mermaid(EVERYTHING, highlight=iter(paths))).marked == mm.marked  # any iterable
    assert mm.marked == {mm.at(p) for p in paths} and len(mm.marked) == 3
    assert dot.marked == {dot.at(p) for p in paths}
    assert dot.nodes[dot.at(paths[2])]["attrs"]["style"] == "filled"
    none_mm, none_dot = draw(EVERYTHING)
    assert none_mm.marked == set() == none_dot.marked
    assert "classDef highlight" not in to_mermaid(EVERYTHING)


def test_a_kept_drawing_marked_by_paths_is_what_to_mermaid_highlights() -> None:
    """drawing_of(term), kept as JSON (a program summary keeps it), then mark_drawing(drawing, paths), gives what
    to_mermaid(term, highlight=paths) gives: for each path, several, a path into a called workflow (its call step)
    and none; a path the drawing has no shape for is given back, unmarked."""
    kept = json.loads(json.dumps(drawing_of(EVERYTHING)))
    paths = sorted(kept["shapes"])
    assert len(paths) > 40
    assert mark_drawing(kept, []) == (to_mermaid(EVERYTHING), [])
    for path in paths:
        assert mark_drawing(kept, [path]) == (to_mermaid(EVERYTHING, highlight=[path]), []), path
    several = paths[::7]
    assert mark_drawing(kept, several) == (to_mermaid(EVERYTHING, highlight=several), [])
    inside = "library['sub'].seq[0].task"
    assert mark_drawing(kept, [inside]) == (to_mermaid(EVERYTHING, highlight=[inside]), [])
    assert mark_drawing(kept, ["seq[99].task", paths[0]]) == (to_mermaid(EVERYTHING, highlight=[paths[0]]),
                                                              ["seq[99].task"])


def test_highlight_takes_one_path_as_a_plain_string() -> None:
    """A single path given as a str highlights that path (not its characters)."""
    mm, _ = draw(seq(t("a"), t("b")), highlight="seq[1].task")
    assert mm.marked == {mm.at("seq[1].task")}


def test_an_unknown_highlight_path_is_a_value_error_naming_it_and_listing_real_ones() -> None:
    """A path the workflow does not have raises ValueError naming it and suggesting paths it does have."""
    term = seq(t("a"), par(t("b"), wait("go")))
    for fn in (to_mermaid, to_dot):
        with pytest.raises(ValueError, match=r"seq\[1\]\.par\[1\]\.task") as err:
            fn(term, highlight=["seq[0].task", "seq[1].par[1].task"])
        message = str(err.value)
        assert fn.__name__ in message and "'seq[1].par[1].wait'" in message and "validate()" in message
        assert "'seq[0].task'," not in message.split("its paths include")[0]


def test_highlight_that_is_not_paths_is_a_type_error() -> None:
    """highlight must be str paths: a number, or a list holding one, is a TypeError saying what to pass."""
    with pytest.raises(TypeError, match=r"iterable of str.*highlight=\['seq\[1\]\.wait'\]"):
        to_mermaid(t("a"), highlight=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got 3 \(int\).*as strings"):
        to_dot(t("a"), highlight=["task", 3])  # type: ignore[list-item]


# -- bad input ---------------------------------------------------------------------------------------------------


def test_a_non_term_is_a_type_error_with_the_fix() -> None:
    """Drawing a function or a value says what was given and how to make it a term."""
    with pytest.raises(TypeError, match=r"to_mermaid\(\) draws a workflow term, got function .*task\(price\)"):
        to_mermaid(price)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"to_dot\(\) draws a workflow term, got list .*built with task\(\)"):
        to_dot([t("a")])  # type: ignore[arg-type]


class Evil:
    """Garbage that fails at everything: repr, str, name, comparison."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")

    __hash__ = object.__hash__

    @property
    def __name__(self) -> str:
        raise RuntimeError("no name")


GARBAGE = [
    Seq(5),  # type: ignore[arg-type]
    Seq(()),
    Seq((1, "x", None, Evil())),  # type: ignore[arg-type]
    Par((t("a"),), join=Evil(), cancel_remaining="yes"),  # type: ignore[arg-type]
    Xor(((1,), (big, t("a")), "z")),  # type: ignore[arg-type]
    Loop(Evil(), while_=5, until=6, times="x", max_iterations=Evil()),
    Wait(Evil(), into=3, timeout="5"),
    Defer(5),
    Defer((("a", 1), "junk", (Evil(), t("b"))), timeout=-1),
    Scope(Evil(), None, on_cancel=5, on_error=t("e"), error_into=7),
    Saga(((t("a"),), (t("b"), 5, 6), (t("c"), t("d")))),  # type: ignore[arg-type]
    MI(Evil(), count=lambda c: 3, items=5, join="zzz", min=1, max=Evil(), until=3, collect=4, name=Evil()),
    Interleave((t("a"), 3), order=5),  # type: ignore[arg-type]
    Interleave((t("a"), t("b")), order=(("a", "b"), ("a", "zz"), 5, (Evil(), 0))),  # type: ignore[arg-type]
    Task(Evil(), name=5),  # type: ignore[arg-type]
    Effect(5, name=Evil(), timeout=Evil(), retry=5),  # type: ignore[arg-type]
    Effect(5, retry=Retry(max_attempts=Evil())),  # type: ignore[arg-type]
    Term(),
]


@pytest.mark.parametrize("term", GARBAGE, ids=[f"garbage{i}" for i in range(len(GARBAGE))])
def test_garbage_inside_terms_still_draws(term: Term) -> None:
    """A term built with garbage (the constructors never check) draws in both formats without raising."""
    mm, _ = draw(term)
    assert "wf_start" in mm.nodes and "wf_end" in mm.nodes


def test_what_is_not_a_term_is_drawn_as_an_invalid_shape() -> None:
    """A non-term in a term's slot is a red 'not a term' shape at its path, saying what is there."""
    mm, dot = draw(Seq((t("a"), 42, t("b"))))  # type: ignore[arg-type]
    assert mm.label("seq[1].?") == "not a term:\n42"
    assert "class n2 invalid" in to_mermaid(Seq((t("a"), 42, t("b"))))  # type: ignore[arg-type]
    assert dot.nodes[dot.at("seq[1].?")]["attrs"]["fillcolor"] == "#ffcdd2"


def test_a_term_no_drawer_can_read_falls_back_to_one_invalid_shape() -> None:
    """A field that raises even when compared (a par's join) gives one 'could not draw' shape with the branches."""
    mm, _ = draw(Par((t("a"), t("b")), join=Evil()))  # type: ignore[arg-type]
    assert mm.label("par") == "par\ncould not draw: RuntimeError"
    assert sorted(d for d, _ in mm.out(mm.at("par"))) == sorted([mm.at("par[0].task"), mm.at("par[1].task")])
    assert not [n for n in mm.nodes if n.startswith("n0_")]  # the failed drawer's half-made shapes are gone


def test_labels_with_quotes_brackets_newlines_and_syntax_characters_are_escaped() -> None:
    """Labels survive both formats exactly: quotes, brackets, newlines, pipes, #, %, <, &, backslashes."""
    name = 'a"b\\c\nd|e#f<g>&`h;%%{i}[j](k) end'
    signal = 's"]\n%%'
    mm, dot = draw(seq(task(price, name=name), defer({signal: t("x")})))
    assert mm.label("seq[0].task") == name == dot.label("seq[0].task")
    assert mm.nodes[mm.at("seq[1].defer", "signal0")]["label"] == f"signal: {signal}"
    assert dot.at(f"seq[1].defer[{signal}].task")  # the DOT tooltip keeps the path whole, newline and all


def test_deep_and_wide_terms_draw_without_recursion() -> None:
    """Terms nested past the recursion limit and seqs thousands long draw (iteratively) in both formats."""
    deep: Term = t("leaf")
    for i in range(900):
        deep = Scope(f"s{i}", deep) if i % 2 else Par((deep,))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)  # well below the depth: a recursive walk or writer would fail
    try:
        text, dot_text = to_mermaid(deep), to_dot(deep)
    finally:
        sys.setrecursionlimit(limit)
    graph = parse_mermaid(text)
    assert len(graph.clusters) == 450 and dot_text.count("subgraph cluster_") == 450
    wide = seq(*(t(f"t{i}") for i in range(3000)))
    assert len(parse_mermaid(to_mermaid(wide)).edges) == 3001 and to_dot(wide).count(" -> ") == 3001
    mm, _ = draw(seq(*(t(f"t{i}") for i in range(200))))  # pydot parses this one: it is slow on big inputs
    assert len(mm.edges) == 201


def test_a_term_that_contains_itself_is_a_value_error_not_a_hang() -> None:
    """A term mutated to contain itself stops at the depth limit with a ValueError saying so."""
    cyclic = Seq((t("a"),))
    object.__setattr__(cyclic, "steps", (cyclic,))
    with pytest.raises(ValueError, match="more than 1,000 deep.*contains itself"):
        to_mermaid(cyclic)


def test_output_is_stable_for_equal_terms() -> None:
    """Equal terms built twice draw the same text: ids come from positions in the term, not object identity."""

    def build() -> Term:
        return seq(t("a"), par(wait("x"), effect(charge)), scope("s", t("b"), on_error=t("c")))

    assert to_mermaid(build()) == to_mermaid(build()) and to_dot(build()) == to_dot(build())
    assert re.findall(r"^\s*(n\d+(?:_\w+)?)\(", to_mermaid(build()), re.M)[0] == "n1"


def test_mermaid_ids_avoid_keywords_and_edge_letters() -> None:
    """No node or subgraph id is a Mermaid keyword or starts with o/x (which Mermaid reads as edge ends)."""
    mm, _ = draw(EVERYTHING)
    for nid in [*mm.nodes, *mm.clusters]:
        assert re.fullmatch(r"(wf_start|wf_end|[nc]\d+(_\w+)?)", nid), nid


# -- real renderers ----------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz `dot` is not on PATH (apt-get install graphviz)")
def test_dot_output_renders_with_graphviz(tmp_path: Path) -> None:
    """Graphviz renders the DOT of every construct (and of the garbage terms) to SVG without a warning."""
    for i, term in enumerate([EVERYTHING, *GARBAGE]):
        source = tmp_path / f"w{i}.dot"
        source.write_text(to_dot(term, highlight=["seq[1].scope"] if term is EVERYTHING else None))
        done = subprocess.run(["dot", "-Tsvg", str(source)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stderr == "", (i, done.stderr)
        assert "<svg" in done.stdout


@pytest.mark.skipif(shutil.which("mmdc") is None, reason="the Mermaid CLI `mmdc` is not on PATH")
def test_mermaid_output_renders_with_mmdc(tmp_path: Path) -> None:
    """The Mermaid CLI renders the flowchart of every construct to SVG."""
    source, target = tmp_path / "w.mmd", tmp_path / "w.svg"
    source.write_text(to_mermaid(EVERYTHING, highlight=["seq[1].scope"]))
    done = subprocess.run(["mmdc", "-i", str(source), "-o", str(target)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "<svg" in target.read_text()


def test_shapes_by_kind_in_dot() -> None:
    """DOT shapes: tasks rounded boxes, gateways diamonds, MI trapezia, events double circles, steps arrows."""
    _, dot = draw(EVERYTHING)
    kinds = {
        "seq[0].task": "box",
        "seq[1].scope": "oval",
        "seq[1].scope.par": "diamond",
        "seq[1].scope.par[1].mi": "trapezium",
        "seq[1].scope.par[5].defer": "Mdiamond",
        "seq[1].scope.par[3].multi_choice[0].milestone": "cds",
    }
    for path, shape in kinds.items():
        assert dot.nodes[dot.at(path)]["shape"] == shape, path
    assert "rounded" in dot.nodes[dot.at("seq[0].task")]["attrs"]["style"]


def test_classes_cover_the_kinds() -> None:
    """Mermaid gives each shape kind its own class (effect, gateway, event, ...), so styles tell them apart."""
    text = to_mermaid(EVERYTHING)
    for name in ("task", "effect", "gateway", "eventGateway", "event", "multiInstance", "region", "lock", "flag",
                 "regionStep", "callActivity", "terminateEvent", "startEvent", "endEvent"):
        assert re.search(rf"^    class \S+ {name}$", text, re.M), name




async def test_a_running_case_status_at_highlights_where_its_threads_are() -> None:
    """A case's `status().at` is a valid highlight: the diagram marks the shapes its threads are parked at."""
    term = seq(t("a"), par(wait("left"), seq(wait("right"), t("b")), wait("late")), t("c"))
    async with running() as (sub, _, sink):
        case = await sub.new_case(term)
        await case.signal("right")
        await sink.wait_for("signal_consumed", case_id=case.case_id)
        status = sub.status(case.case_id)
        await case.cancel()
    assert set(status.at) == {"seq[1].par[0].wait", "seq[1].par[2].wait"}
    mm, dot = draw(term, highlight=status.at)
    assert mm.marked == {mm.at(p) for p in status.at} == dot.marked


def test_timers_from_data_and_unlimited_retries_are_labelled_by_their_functions() -> None:
    """sleep(fn), sleep(until=fn) and timeout=fn show the function's name; Retry(None) shows ∞ or its time bound."""

    def due_in(ctx: Any) -> float:
        return 5.0

    def due_at(ctx: Any) -> str:
        return "2027-01-01T00:00:00Z"

    wf = seq(
        sleep(due_in),
        sleep(until=due_at),
        wait("approved", timeout=due_in),
        defer({"accept": t("book")}, timeout=due_in, on_timeout=t("expire")),
        effect(charge, retry=Retry(None, initial=1)),
        effect(charge, retry=Retry(None, initial=1, max_elapsed=3600)),
        effect(charge, retry=Retry(5, max_elapsed=60)),
    )
    mm, dot = draw(wf)
    assert mm.label("seq[0].sleep") == "timer: due_in()"
    assert mm.label("seq[1].sleep") == "timer: until due_at()"
    assert mm.label("seq[2].wait") == "signal: approved\ntimeout due_in()"
    assert mm.label("seq[3].defer") == "event-based\n(defer)\ntimeout due_in()"
    assert "timer: due_in()" in {mm.nodes[d]["label"] for d, _ in mm.out(mm.at("seq[3].defer"))}
    assert mm.label("seq[4].effect") == "effect: charge\nretry ∞"
    assert mm.label("seq[5].effect") == "effect: charge\nretry ≤3600s"
    assert mm.label("seq[6].effect") == "effect: charge\nretry ×5 ≤60s"
    for path in ("seq[0].sleep", "seq[1].sleep"):
        assert mm.nodes[mm.at(path)]["shape"] == "event" and dot.nodes[dot.at(path)]["shape"] == "doublecircle"


def test_a_scope_finally_and_a_heartbeat_timeout_are_drawn() -> None:
    """finally_ follows the body and the on_error branch (and hangs off the scope on a dashed "finally" edge); an
    effect's heartbeat_timeout is in its label; both formats."""
    async def poll(ctx: Any) -> None:
        return None

    wf = seq(
        scope("s", effect(poll, heartbeat_timeout=30), on_error=task(lambda c: None, name="err"),
              finally_=task(lambda c: None, name="cleanup")),
        task(lambda c: None, name="after"),
    )
    mermaid = wfsub.to_mermaid(wf)
    by_path = {path: node for node, path in re.findall(r"^\s*%% (\w+): (\S+)$", mermaid, re.M)}
    fin, body, err, after = (by_path[p] for p in ("seq[0].scope[finally].task", "seq[0].scope.effect",
                                                    "seq[0].scope[on_error].task", "seq[1].task"))
    assert "heartbeat 30s" in mermaid
    for src in (body, err):
        assert f"{src} --> {fin}" in mermaid
    assert f"{fin} --> {after}" in mermaid
    assert f'{by_path["seq[0].scope"]} -.->|"finally"| {fin}' in mermaid
    dot = wfsub.to_dot(wf)
    assert "heartbeat 30s" in dot and 'label="finally"' in dot

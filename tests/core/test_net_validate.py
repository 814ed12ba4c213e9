"""Static checks of `net(...)`: each problem validation can see, at its node path, and the term's own shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import wfsub
from wfsub import InvalidWorkflow, net, seq, task


def noop(ctx: Mapping[str, Any]) -> None:
    return None


def yes(ctx: Mapping[str, Any]) -> bool:
    return True


A = task(noop)


def issues(term: Any) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in wfsub.validate(term)]


def only(term: Any) -> tuple[str, str]:
    """The one issue of `term`."""
    found = issues(term)
    assert len(found) == 1, found
    return found[0]


def test_a_well_formed_net_with_cycles_and_every_kind_has_no_issue() -> None:
    """A net with a cycle, and/xor/or splits and joins, and predicates on xor/or edges validates cleanly."""
    term = net(
        {"a": A, "b": A, "c": A, "j": A},
        [("start", "a"), ("start", "b"), ("a", "j"), ("b", "c", yes), ("b", "j"), ("c", "b"), ("c", "end"),
         ("j", "end")],
        split={"b": "or", "c": "xor"},
        join={"j": "or", "b": "xor"},
    )
    assert issues(term) == []


@pytest.mark.parametrize("name", ["start", "end"])
def test_reserved_node_names_are_rejected(name: str) -> None:
    """A node named "start" or "end" is an issue at the net: those names are the net's entry and exit."""
    path, message = only(net({name: A, "a": A}, [("start", "a"), ("a", "end")]))
    assert path == "net"
    assert f"node name {name!r} is reserved" in message


def test_unknown_node_names_in_edges_are_rejected() -> None:
    """An edge naming a node that does not exist is an issue at the net, listing the nodes there are."""
    path, message = only(net({"a": A}, [("start", "a"), ("a", "ghost"), ("a", "end")]))
    assert (path, message) == ("net", "edge ('a', 'ghost') names unknown node 'ghost' (nodes: a, start, end)")


def test_edges_into_start_or_out_of_end_are_rejected() -> None:
    """start has no incoming edges and end no outgoing ones."""
    found = issues(net({"a": A}, [("start", "a"), ("a", "end"), ("a", "start"), ("end", "a")]))
    assert [p for p, _ in found] == ["net", "net"]
    assert 'enters "start": start has no incoming edges' in found[0][1]
    assert 'leaves "end": end has no outgoing edges' in found[1][1]


def test_a_node_unreachable_from_start_is_rejected_at_its_path() -> None:
    """A node no path from start enters is an issue at that node."""
    path, message = only(net({"a": A, "b": A}, [("start", "a"), ("a", "end"), ("b", "end")]))
    assert path == "net[b].task"
    assert "node 'b' is unreachable from start" in message


def test_a_node_with_no_path_to_end_is_rejected_at_its_path() -> None:
    """A node from which no path leads to end (a sink, or a cycle without exit) is an issue at that node."""
    found = issues(net({"a": A, "b": A, "c": A}, [("start", "a"), ("a", "end"), ("a", "b"), ("b", "c"), ("c", "b")]))
    assert [p for p, _ in found] == ["net[b].task", "net[c].task"]
    assert "node 'b' has no path to end" in found[0][1]


def test_predicates_on_the_edges_of_an_and_split_are_rejected() -> None:
    """An and split (the default) takes every edge: a predicate on one of its edges is an issue at the node."""
    path, message = only(net({"a": A, "b": A}, [("start", "a"), ("a", "b", yes), ("a", "end"), ("b", "end")]))
    assert path == "net[a].task"
    assert "edge ('a', 'b') has a predicate, but 'a' is an and split" in message


def test_predicates_on_the_edges_of_start_need_an_xor_or_or_split_of_start() -> None:
    """start's split is "and" by default too: a predicate on its edges is an issue at the net."""
    path, message = only(net({"a": A, "b": A}, [("start", "a", yes), ("start", "b"), ("a", "end"), ("b", "end")]))
    assert path == "net"
    assert "'start' is an and split" in message
    clean = net({"a": A, "b": A}, [("start", "a", yes), ("start", "b"), ("a", "end"), ("b", "end")],
                split={"start": "xor"})
    assert issues(clean) == []


def test_a_join_declared_on_end_is_rejected() -> None:
    """end takes every arrival: a join declared on it is an issue at the net."""
    term = net({"a": A, "b": A}, [("start", "a"), ("start", "b"), ("a", "end"), ("b", "end")], join={"end": "and"})
    assert only(term) == ("net", 'a join is declared on "end": every token that reaches end is done; remove it')


def test_an_and_join_fed_by_two_edges_of_one_xor_split_is_rejected() -> None:
    """An xor split sends its token down one edge: an and-join waiting for two of its edges would wait forever."""
    term = net(
        {"s": A, "a": A, "b": A, "j": A},
        [("start", "s"), ("s", "a", yes), ("s", "b"), ("a", "j"), ("b", "j"), ("j", "end")],
        split={"s": "xor"},
        join={"j": "and"},
    )
    path, message = only(term)
    assert path == "net[j].task"
    assert "the and-join 'j' is fed by two edges of the xor split 's' (to 'a' and 'b')" in message
    as_or = net(
        {"s": A, "a": A, "b": A, "j": A},
        [("start", "s"), ("s", "a", yes), ("s", "b"), ("a", "j"), ("b", "j"), ("j", "end")],
        split={"s": "xor"},
        join={"j": "or"},
    )
    assert issues(as_or) == []


def test_an_and_join_after_an_xor_that_merges_first_is_accepted() -> None:
    """An xor split whose branches merge before an and split that feeds the join is sound: no issue."""
    term = net(
        {"s": A, "a": A, "b": A, "m": A, "x": A, "y": A, "j": A},
        [("start", "s"), ("s", "a", yes), ("s", "b"), ("a", "m"), ("b", "m"), ("m", "x"), ("m", "y"),
         ("x", "j"), ("y", "j"), ("j", "end")],
        split={"s": "xor"},
        join={"j": "and"},
    )
    assert issues(term) == []


@pytest.mark.parametrize(
    ("split", "join", "fragment"),
    [
        ({"a": "xor"}, {}, "split='xor' is given for 'a', which has one outgoing edge"),
        ({}, {"a": "and"}, "join='and' is given for 'a', which has one incoming edge"),
    ],
)
def test_a_split_or_join_kind_for_a_node_with_one_edge_is_rejected(
    split: dict[str, str], join: dict[str, str], fragment: str
) -> None:
    """A split needs two or more outgoing edges and a join two or more incoming ones."""
    path, message = only(net({"a": A}, [("start", "a"), ("a", "end")], split=split, join=join))
    assert path == "net[a].task"
    assert fragment in message


def test_bad_kinds_are_rejected() -> None:
    """A split or join kind that is not one of the three is an issue at the net, naming the valid ones."""
    term = net({"a": A, "b": A}, [("start", "a"), ("start", "b"), ("a", "end"), ("b", "end")],
               split={"start": "both"}, join={"a": "all"})
    assert issues(term) == [
        ("net", "split={'start': 'both'} is not a split kind: use 'and', 'xor' or 'or'"),
        ("net", "join={'a': 'all'} is not a join kind: use 'xor', 'and' or 'or'"),
    ]


def test_a_kind_for_an_unknown_node_is_rejected() -> None:
    """split/join keys must be nodes of the net."""
    path, message = only(net({"a": A}, [("start", "a"), ("a", "end")], join={"ghost": "or"}))
    assert (path, message) == ("net", "join names unknown node 'ghost' (nodes: a, start, end)")


def test_non_callable_predicates_are_rejected() -> None:
    """An edge predicate must be a function of ctx."""
    term = net({"a": A, "b": A}, [("start", "a"), ("a", "b", True), ("a", "end"), ("b", "end")], split={"a": "xor"})
    assert only(term) == ("net", "edge ('a', 'b') predicate must be a function of ctx, got True")


def test_non_term_nodes_are_rejected_at_their_path() -> None:
    """A node that is not a term (a bare function) is an issue at the node's path, with the fix."""
    path, message = only(net({"a": noop}, [("start", "a"), ("a", "end")]))
    assert path == "net[a].?"
    assert "expected a workflow term" in message and "task(noop)" in message


def test_duplicate_edges_are_rejected() -> None:
    """The same (src, dst) twice is an issue at the net."""
    path, message = only(net({"a": A}, [("start", "a"), ("a", "end"), ("a", "end")]))
    assert path == "net"
    assert "edge ('a', 'end') is given twice" in message


@pytest.mark.parametrize(
    ("term", "fragment"),
    [
        (net({}, [("start", "end")]), 'net needs at least one node besides "start" and "end"'),
        (net([A], [("start", "end")]), "net nodes must be a mapping {name: term}"),  # type: ignore[arg-type]
        (net({"a": A}, "start->a"), "net edges must be a list of (src, dst) or (src, dst, pred)"),  # type: ignore[arg-type]
        (net({"a": A}, [("start", "a"), ("a",), ("a", "end")]), "edge ('a',) must be (src, dst) or (src, dst, pred)"),
        (net({"": A}, [("start", "end")]), "net node names must be non-empty str"),
    ],
)
def test_malformed_nets_are_reported_not_raised(term: Any, fragment: str) -> None:
    """Malformed arguments never raise at construction: validation reports them at the net."""
    found = issues(term)
    assert any(path == "net" and fragment in message for path, message in found), found


def test_issues_inside_nodes_are_reported_at_their_node_paths() -> None:
    """A node's own problems carry the node path (net[name].kind...)."""
    term = seq(A, net({"review": seq(task(42))}, [("start", "review"), ("review", "end")]))  # type: ignore[arg-type]
    assert only(term)[0] == "seq[1].net[review].seq[0].task"


def test_compile_raises_with_every_issue() -> None:
    """compile() refuses an invalid net with InvalidWorkflow carrying all its issues."""
    with pytest.raises(InvalidWorkflow) as caught:
        wfsub.compile(net({"a": A, "b": A}, [("start", "a"), ("a", "end"), ("b", "ghost")]))
    assert len(caught.value.issues) == 1


def test_a_net_term_is_hashable_equal_by_value_and_reads_like_code() -> None:
    """Two nets built alike are equal with one hash; repr reads like the call that built them."""
    def build() -> Any:
        return net({"a": A, "b": A}, [("start", "a"), ("a", "b", yes), ("a", "end"), ("b", "end")],
                   split={"a": "or"})

    assert build() == build() and hash(build()) == hash(build())
    assert repr(build()) == (
        "net({'a': task(noop), 'b': task(noop)}, [('start', 'a'), ('a', 'b', yes), ('a', 'end'), ('b', 'end')], "
        "split={'a': 'or'})"
    )
    assert build() != net({"a": A, "b": A}, [("start", "a"), ("a", "b", yes), ("a", "end"), ("b", "end")],
                          split={"a": "xor"})


def test_every_problem_of_a_net_is_reported_at_once() -> None:
    """A bad kind does not hide the reachability problems: one validate call reports them all."""
    term = net({"a": A, "b": A}, [("start", "a"), ("a", "b", yes), ("a", "end")], join={"a": "any"})
    assert [p for p, _ in issues(term)] == ["net", "net[a].task", "net[b].task"]

"""Workflow diagrams: `to_mermaid(term)` and `to_dot(term)` draw a term as a BPMN-like flow.

    mermaid = wfsub.to_mermaid(order)                            # a str: paste it into any Mermaid renderer
    Path("order.dot").write_text(wfsub.to_dot(order, highlight=["seq[2].wait"]))   # dot -Tsvg order.dot

What is drawn how (the same in both formats):

    start / end event         circle; end has a thick border; `terminate` is a filled circle
    task                      rounded box, labelled with its name or function name
    effect                    box with a double border, with its timeout, heartbeat timeout and retry policy
    call                      box with a thick border ("call approve")
    par / xor / multi_choice  split and join gateways (diamonds): AND, XOR, OR; the join of a par says how it
                              synchronizes: AND (all), 1-of-m (first), n-of-m, multi-merge (each)
    defer                     event-based gateway with one signal event per branch and a timer event
    loop                      a gateway with the condition and a thick back edge labelled with it
    mi                        a cluster between an MI split (|||, count or items) and an MI join (its policy)
    wait / sleep              intermediate events (double circle): "signal: name" (with its timeout or deadline),
                              "timer" (a timer computed from the data is labelled by its function: "timer: until
                              due_at()", a deadline "deadline due_at()")
    scope / saga              clusters; on_error and on_cancel leave through boundary events on dashed edges,
                              each saga step's compensation hangs off it on a dashed "compensate" edge; a
                              scope's finally_ follows the body and the handlers, and a dashed "finally" edge
                              from the scope says it also runs when the body fails or is withdrawn
    interleave                gateways "interleave (one at a time)"; order pairs as dashed "before" edges
    critical / milestone      clusters with a lock / a flag at the entry; when_milestone is a flag guard with
                              a dashed "enables" edge from the milestone of that name
    region steps              arrow shapes ("cancel region r") with a dashed edge to the region they act on
    net                       its graph: each node's term, edges labelled with their predicates, split and
                              join gateways where a node has several outgoing or incoming edges

Every shape that stands for a term carries that term's node path (`seq[1].par[0].task`, as `validate` and
a case's status report it): a Mermaid comment line `%% <id>: <path>` before it (a `%` in the path written
`%25`, so a name cannot make a `%%{init}%%` directive), the `tooltip` in DOT.
`highlight=` takes node paths and marks their shapes (Mermaid class `highlight`, a yellow fill in DOT); a seq
has no shape of its own, so its path marks its first step's.

A Substrate with a store keeps each version's drawing in the version's program summary, so a process without
the workflows (a `wfsub.Client`, `wfsub web STORE`) draws a case on the version it runs.

The walk is iterative (any depth draws), and a workflow that `validate` rejects still draws: what is not a
term, or not what its slot expects, is drawn as a red "invalid" shape that says what was found there.
"""

from __future__ import annotations

from ... import to_dot as to_dot  # (drawn by wfsub._diagram, below the runtime: see above)
from ... import to_mermaid as to_mermaid

__all__ = ["to_dot", "to_mermaid"]

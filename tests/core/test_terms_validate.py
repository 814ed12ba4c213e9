"""The algebra's terms and the static checks of validate()."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import wfsub
from wfsub import (
    Retry,
    call,
    critical,
    defer,
    effect,
    interleave,
    loop,
    mi,
    milestone,
    multi_choice,
    par,
    scope,
    seq,
    sleep,
    task,
    terminate,
    validate,
    wait,
    when_milestone,
    xor,
)


def fetch(ctx: Mapping[str, Any]) -> None:
    return None


def check(ctx: Mapping[str, Any]) -> bool:
    return True


async def charge(ctx: Mapping[str, Any]) -> None:
    return None


def issues_of(term: Any, **kw: Any) -> list[tuple[str, str]]:
    return [(i.path, i.message) for i in validate(term, **kw)]


def test_repr_reads_like_the_code_that_built_it() -> None:
    """repr of a term is the constructor call, with only non-default keywords."""
    wf = seq(task(fetch), par(task(fetch), effect(charge, timeout=5.0), join="first"), wait("go", transient=True))
    assert repr(wf) == (
        "seq(task(fetch), par(task(fetch), effect(charge, timeout=5.0), join='first'), wait('go', transient=True))"
    )
    assert repr(defer({"a": task(fetch)}, timeout=1, on_timeout=terminate())) == (
        "defer({'a': task(fetch)}, timeout=1, on_timeout=terminate())"
    )
    assert repr(loop(task(fetch), while_=check)) == "loop(task(fetch), while_=check)"


def test_terms_are_immutable_hashable_and_equal_by_structure() -> None:
    """Equal structure gives equal terms with equal hashes; attributes cannot be assigned."""
    a = seq(task(fetch), mi(task(fetch), count=3, name="m"))
    b = seq(task(fetch), mi(task(fetch), count=3, name="m"))
    assert a == b and hash(a) == hash(b)
    assert a != seq(task(fetch), mi(task(fetch), count=4, name="m"))
    assert len({a, b}) == 1
    with pytest.raises(AttributeError):
        a.steps = ()  # type: ignore[misc]


def test_constructors_never_raise_on_bad_arguments() -> None:
    """Bad arguments are recorded, so validate() can report all of them at once."""
    wf = seq(par(join=[1]), mi(task(fetch), count="x"), sleep(-1))  # type: ignore[arg-type]
    assert [path for path, _ in issues_of(wf)] == ["seq[0].par", "seq[1].mi", "seq[2].sleep"]


def test_valid_workflow_has_no_issues() -> None:
    """Every constructor used correctly passes validation."""
    wf = seq(
        task(fetch),
        effect(charge, retry=Retry(3, 0.1, 2.0, 1.0)),
        par(task(fetch), task(fetch), join=1, cancel_remaining=True),
        xor((check, task(fetch)), default=task(fetch)),
        multi_choice((check, task(fetch)), (check, task(fetch))),
        loop(task(fetch), times=2, max_iterations=5),
        wait("a"),
        defer({"b": task(fetch)}, timeout=3, on_timeout=task(fetch)),
        sleep(1),
        scope("s", task(fetch), on_cancel=task(fetch)),
        mi(task(fetch), count=3, join=2, min=1, max=5, collect="out", name="m"),
        mi(task(fetch), count=1, dynamic=True, name="d"),
        interleave(task(fetch), task(check), order=[("fetch", "check")]),
        critical("c", task(fetch)),
        milestone("ms", task(fetch)),
        when_milestone("ms", task(fetch)),
        call("sub"),
        terminate(),
    )
    assert validate(wf, library={"sub": task(fetch)}) == []


@pytest.mark.parametrize(
    ("term", "path", "fragment"),
    [
        (seq(), "seq", "at least one branch"),
        (seq(task(fetch), par()), "seq[1].par", "at least one branch"),
        (xor(), "xor", "at least one"),
        (multi_choice(), "multi_choice", "at least one"),
        (interleave(), "interleave", "at least one branch"),
        (par(task(fetch), join=0), "par", "at least 1"),
        (par(task(fetch), task(fetch), join=3), "par", "exceeds the 2 branches"),
        (par(task(fetch), join="some"), "par", "not a join policy"),
        (mi(task(fetch), count=2, join=3), "mi", "exceeds the 2 branches"),
        (mi(task(fetch), count=lambda c: 2, min=3, max=1), "mi", "min=3 is greater than max=1"),
        (mi(task(fetch), count=-1), "mi", "count=-1 must be >= 0"),
        (mi(task(fetch)), "mi", "exactly one of count="),
        (mi(task(fetch), count=1, join=None, collect="k"), "mi", "collect needs a join"),
        (loop(task(fetch)), "loop", "exactly one of while_=, until=, times= (got none)"),
        (loop(task(fetch), times=1, until=check), "loop", "(got until and times)"),
        (seq(scope("r", task(fetch)), mi(task(fetch), count=1, name="r")), "seq[1].mi", "already used"),
        (defer({}), "defer", "at least one"),
        (defer({"a": task(fetch)}, timeout=3), "defer", "add on_timeout="),
        (defer({"a": task(fetch)}, on_timeout=task(fetch)), "defer", "add timeout="),
        (task(charge), "task", "use effect(charge)"),
        (effect(fetch), "effect", "define it with `async def`"),
        (xor((1, task(fetch))), "xor[0]", "predicate must be a function"),
        (loop(task(fetch), while_="yes"), "loop", "while_ must be a function"),
        (call("nope"), "call", "needs a library: pass Substrate(workflows={'nope': workflow}), or library="),
        (interleave(task(fetch), order=[(0, 5)]), "interleave", "unknown branch 5"),
        (interleave(task(fetch), task(check), order=[(0, 1), (1, 0)]), "interleave", "forms a cycle"),
        (sleep(-1), "sleep", "non-negative"),
        (defer({"a": task(fetch)}, timeout=-2, on_timeout=task(fetch)), "defer", "non-negative"),
        (effect(charge, timeout=-1), "effect", "positive number"),
        (seq(task(fetch), fetch), "seq[1].?", "wrap it as task(fetch)"),
        (mi(task(fetch), count=1, dynamic=True), "mi", "needs name="),
        (defer({}, timeout=5, on_timeout=task(fetch)), "defer", "at least one {signal: branch}"),
        (par(milestone("open", task(fetch)), when_milestone("opne", task(fetch))), "par[1].when_milestone",
         "names no milestone of the workflow (milestones: 'open')"),
        (critical("L", seq(task(fetch), critical("L", task(fetch)))), "critical.seq[1].critical",
         "not reentrant"),
    ],
)
def test_validate_reports_path_and_fix(term: Any, path: str, fragment: str) -> None:
    """Each bad term yields an issue at the right node path with a message saying how to fix it."""
    found = issues_of(term)
    assert len(found) == 1 and found[0][0] == path and fragment in found[0][1], found


def test_call_of_missing_library_name_is_reported() -> None:
    """call() of a name that the library lacks names the known workflows and the fix."""
    found = issues_of(seq(task(fetch), call("ship")), library={"bill": task(fetch)})
    assert found == [(
        "seq[1].call",
        "call('ship'): no workflow of that name in the library (bill): "
        "register it in workflows= / library=, or check the spelling",
    )]


def test_region_names_are_scoped_to_the_workflow_that_declares_them() -> None:
    """Two library workflows (and the root) may each use a region called 'payment' without a conflict."""
    library = {"a": scope("payment", task(fetch)), "b": mi(task(fetch), count=1, name="payment")}
    assert issues_of(par(scope("payment", task(fetch)), call("a"), call("b")), library=library) == []


def test_only_library_workflows_the_term_can_reach_are_checked() -> None:
    """A broken library entry that no call reaches does not stop a workflow that never calls it."""
    library = {"good": task(fetch), "broken": seq()}
    assert issues_of(call("good"), library=library) == []
    assert wfsub.compile(call("good"), library=library).entries.keys() == {"good"}


def test_issues_in_a_called_library_workflow_name_the_call_that_reaches_it() -> None:
    """An issue inside a library workflow is reported at its own path, saying which call reaches it."""
    library = {"outer": seq(task(fetch), call("inner")), "inner": par()}
    found = issues_of(seq(task(fetch), call("outer")), library=library)
    assert found == [
        (
            "library['inner'].par",
            "par needs at least one branch (in library workflow 'inner', called at library['outer'].seq[1].call)",
        )
    ]


def test_equality_compares_types_too() -> None:
    """join=True is not join=1 and times=2.0 is not times=2: a valid cached term never stands in for them."""
    assert par(task(fetch), join=True) != par(task(fetch), join=1)  # type: ignore[arg-type]
    assert loop(task(fetch), times=2.0) != loop(task(fetch), times=2)  # type: ignore[arg-type]
    assert validate(par(task(fetch), join=True))  # type: ignore[arg-type]


def test_nested_paths_name_every_level() -> None:
    """Paths go through indexes and container bodies: seq[1].par[0].mi."""
    wf = seq(task(fetch), par(mi(task(fetch), count=1, join=2), task(fetch)))
    assert issues_of(wf)[0][0] == "seq[1].par[0].mi"


def test_validate_never_raises_on_garbage() -> None:
    """validate() of things that are not terms returns issues instead of raising."""
    assert issues_of(42)[0][0] == "workflow"
    assert issues_of(seq(None, "x", 3))  # type: ignore[arg-type]
    assert issues_of(task(fetch), library=[1, 2])[0][0] == "library"


def test_compile_raises_invalid_workflow_with_every_issue() -> None:
    """compile() refuses a bad term and its error lists each issue with its path."""
    with pytest.raises(wfsub.InvalidWorkflow) as info:
        wfsub.compile(seq(par(), sleep(-1)))
    assert [issue.path for issue in info.value.issues] == ["seq[0].par", "seq[1].sleep"]
    assert "seq[0].par" in str(info.value) and "seq[1].sleep" in str(info.value)

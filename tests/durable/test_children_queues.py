"""Child cases started through a queue (`start_case(..., queue=, priority=, dedup=)`): the child waits in its
queue like any queued case, the parent waits for it (across a restart), and the queue name is checked when the
Substrate is built; on Memory, SQLite and Postgres."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wfsub import CaseExists, CaseNotFound, InvalidWorkflow, Queue, Substrate, scope, seq, start_case, task, wait
from wfsub.stores import Store

from ..stores._helpers import STORE_PARAMS, make_store, twin
from ._util import eventually, field, kinds

CHILD = seq(wait("go"), task(lambda c: {"done": c["x"] * 2}))
PARENT = seq(start_case("child", data=lambda c: {"x": c["n"]}, queue="kids", priority=1, into="kid"))
DEDUPED = seq(scope("s", start_case("child", data=lambda c: {"x": 0}, queue="kids", dedup="one",
                                    case_id=lambda c: f"dup-{c['n']}"),
                    on_error=task(lambda c: {"refused": c["error"]["type"]})))
WORKFLOWS: dict[str, Any] = {"parent": PARENT, "child": CHILD, "deduped": DEDUPED}
QUEUES = {"kids": Queue(concurrency=1)}
CHILD_ID = "P/seq[0].start_case"


def state(sub: Substrate, case_id: str) -> str | None:
    try:
        return sub.status(case_id).state.value
    except CaseNotFound:
        return None


@pytest.fixture(params=STORE_PARAMS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return make_store(request.param, tmp_path)


async def test_a_parent_waits_for_its_queued_child_across_a_restart(store: Store) -> None:
    """A child started through a full queue is queued (its queue, priority and parent shown, listed by parent);
    the parent waits, across a restart, until the child has left the queue, run and ended, and merges its result."""
    async with Substrate(store=store, workflows=WORKFLOWS, queues=QUEUES) as sub:
        await sub.new_case("child", {"x": 1}, queue="kids", case_id="blocker")
        await eventually(lambda: sub.status("blocker").state == "waiting_signal")
        await sub.new_case("parent", {"n": 4}, case_id="P")
        await eventually(lambda: state(sub, CHILD_ID) == "queued")
        queued = sub.status(CHILD_ID)
        assert (queued.queue, queued.priority, queued.parent) == ("kids", 1, "P")
        assert [s.case_id for s in sub.cases(parent="P")] == [CHILD_ID]
        assert sub.status("P").state == "waiting_effect"
    async with Substrate(store=twin(store), workflows=WORKFLOWS, queues=QUEUES) as sub:
        assert sub.status(CHILD_ID).state == "queued"
        await sub.signal("blocker", "go")
        await eventually(lambda: sub.status(CHILD_ID).state == "waiting_signal")
        assert sub.status(CHILD_ID).parent == "P" and sub.status("P").children == (CHILD_ID,)
        await sub.signal(CHILD_ID, "go")
        assert (await sub.await_case("P"))["kid"] == {"x": 4, "go": None, "done": 8}
        child = await sub.journal(CHILD_ID)
        assert kinds(child).count("start") == 1 and child[0].model_extra["parent"] == "P"
        assert [field(r, "name") for r in await sub.journal("P") if r.kind == "effect"] == ["start_case('child')"]


async def test_a_queued_childs_dedup_key_held_by_a_live_case_fails_the_step(store: Store) -> None:
    """A child whose dedup key a live case of its queue holds fails its step with CaseExists (caught here)."""
    async with Substrate(store=store, workflows=WORKFLOWS, queues=QUEUES) as sub:
        await sub.new_case("child", {"x": 1}, queue="kids", dedup="one", case_id="holder")
        result = await (await sub.new_case("deduped", {"n": 1}, case_id="D")).result()
        assert result["refused"] == CaseExists.__name__ and "of queue 'kids' " in result["error"]["message"]


def test_a_start_case_on_a_queue_the_substrate_does_not_have_is_refused_when_it_is_built() -> None:
    """start_case(queue=) naming a queue that queues= lacks is refused by the Substrate, naming the workflow, the
    step and the queues it has; priority=/dedup= without queue= are refused when the workflow is checked."""
    bad = {"parent": seq(start_case("child", queue="kidz")), "child": CHILD}
    with pytest.raises(ValueError, match=r"no queue 'kidz' \(configured: 'kids'\).*workflows\['parent'\] "
                                         r"seq\[0\]\.start_case"):
        Substrate(workflows=bad, queues=QUEUES)
    with pytest.raises(InvalidWorkflow, match="priority= and dedup= apply to a child started through a queue"):
        Substrate(workflows={"parent": seq(start_case("child", dedup="k")), "child": CHILD})

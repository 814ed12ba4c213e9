"""The group commit both database stores share (`_group.py`): the queue's hand-offs, batching, delivery."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from wfsub._errors import StoreError
from wfsub._store._group import GroupQueue, Job, by_key, runs
from wfsub.stores import PostgresStore, SqliteStore

from ._helpers import STORE_PARAMS, first_write, make_store, opened


def job(label: str, batch: object = None, *, wait: bool = False) -> Job:
    return Job(None, label, wait=wait, batch=batch)


def test_the_writer_is_rung_only_when_it_sleeps() -> None:
    """submit() rings a writer that found nothing to take, once; jobs queued while it works cost no ring."""
    rings: list[int] = []
    queue = GroupQueue("test", lambda: rings.append(1))
    assert queue.take() is None  # asleep
    queue.submit(job("a"))
    queue.submit(job("b"))
    assert rings == [1]
    taken = queue.take()
    assert taken is not None and [j.label for j in taken[0]] == ["a", "b"] and taken[1] is False
    queue.submit(job("c"))  # awake: no ring
    assert rings == [1] and queue.queued() == 1
    queue.stop()
    taken = queue.take()
    assert taken is not None and [j.label for j in taken[0]] == ["c"] and taken[1] is True
    assert queue.groups == 2 and queue.jobs == 3


def test_a_writer_that_woke_by_itself_is_not_rung() -> None:
    """After a timeout, awake() clears the sleeping mark (no ring comes) and says whether work came meanwhile."""
    rings: list[int] = []
    queue = GroupQueue("test", lambda: rings.append(1))
    assert queue.take() is None
    assert queue.awake() is False
    queue.submit(job("a"))
    assert rings == [] and queue.awake() is True


def test_jobs_queued_after_a_delivery_are_prompt_the_others_early() -> None:
    """Jobs queued while a group committed are early; those queued after its delivery are prompt."""
    queue = GroupQueue("test", lambda: None)
    queue.submit(job("first"))
    first = queue.take()
    assert first is not None
    queue.submit(job("early"))  # while `first` commits
    queue.deliver(first[0])
    queue.submit(job("prompt"))
    taken = queue.take()
    assert taken is not None and [(j.label, j.prompt) for j in taken[0]] == [("early", False), ("prompt", True)]


def test_runs_keep_order_and_by_key_gathers() -> None:
    """runs() cuts consecutive jobs of one key (None: alone); by_key() gathers each key's jobs in order."""
    group = [job("a", 1), job("b", 1), job("c"), job("d"), job("e", 1)]
    cut = runs(group, lambda j: True if j.batch is not None else None)
    assert [(k, [j.label for j in js]) for k, js in cut] == [
        (True, ["a", "b"]), (None, ["c"]), (None, ["d"]), (True, ["e"])
    ]
    gathered = by_key(group, lambda j: j.batch)
    assert [(k, [j.label for j in js]) for k, js in gathered] == [(1, ["a", "b", "e"]), (None, ["c", "d"])]


async def test_deliver_wakes_each_waiter_with_its_result_or_error() -> None:
    """deliver() wakes every waiter of the group (through its loop's token) with its result or its StoreError."""
    queue = GroupQueue("test", lambda: None)
    good, bad = job("good", wait=True), job("bad", wait=True)
    for j in (good, bad):
        queue.submit(j)
    taken = queue.take()
    assert taken is not None
    good.result = 7
    bad.error = StoreError("test", "refused")
    outcomes: dict[str, object] = {}

    async def wait(j: Job) -> None:
        try:
            outcomes[j.label] = await j.outcome()
        except StoreError as exc:
            outcomes[j.label] = exc

    async with anyio.create_task_group() as tg:
        for j in (good, bad):
            tg.start_soon(wait, j)
        await anyio.wait_all_tasks_blocked()
        queue.deliver(taken[0])
    assert outcomes["good"] == 7 and isinstance(outcomes["bad"], StoreError)


@pytest.mark.parametrize("kind", [p for p in STORE_PARAMS if p != "memory"])
async def test_both_database_stores_queue_their_writes_on_a_group_queue(kind: str, tmp_path: Path) -> None:
    """SqliteStore's writer thread and PostgresStore's writer task take their writes from one GroupQueue class."""
    store = make_store(kind, tmp_path)
    async with opened(store):
        await store.write(first_write("a"))
        if isinstance(store, SqliteStore):
            assert store._writer is not None
            queue = store._writer.queue
        else:
            assert isinstance(store, PostgresStore)
            assert store._c.queue is not None
            queue = store._c.queue
        assert isinstance(queue, GroupQueue) and queue.jobs >= 1

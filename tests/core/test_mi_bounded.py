"""A big mi keeps the work of one vm step and the records alive at a time bounded, whatever its size."""

from __future__ import annotations

import gc
import json
from collections.abc import Mapping
from typing import Any

import wfsub
from wfsub import mi, par, seq, task
from wfsub._program import SPAWN_CHUNK
from wfsub._vm._records import InstanceFrame, MIFrame
from wfsub.lowlevel import Machine

N = 20_000


def noop(ctx: Mapping[str, Any]) -> None:
    return None


def _mi_frame(m: Machine) -> MIFrame | None:
    acts = m._vm.regions.get("big", {})
    return next(iter(acts), None)  # type: ignore[return-value]


def test_a_big_mi_holds_about_a_chunk_of_instances_at_a_time() -> None:
    """The spawner queues behind the chunk it started: a big mi of short bodies never holds more than two chunks."""
    m = Machine(wfsub.compile(mi(task(noop), count=N, max=N, name="big", collect="out")), max_instances=N)
    most = 0
    while m.run(100).status == "yielded":
        frame = _mi_frame(m)
        if frame is not None:
            most = max(most, frame.count)
    assert m.status == "done"
    assert most <= 2 * SPAWN_CHUNK + 1  # never more than a chunk or two alive after a burst (plus the spawner)
    assert len(m.data["out"]) == N


def test_big_mi_instances_run_in_index_order_and_behind_earlier_threads() -> None:
    """FIFO order is kept: a thread queued before the mi's instances runs first; the instances run by index."""
    seen: list[Any] = []

    def note(ctx: Mapping[str, Any]) -> None:
        seen.append(ctx.get("index", "other"))

    n = 3 * SPAWN_CHUNK + 5
    m = Machine(wfsub.compile(par(mi(task(note), count=n), task(note))))
    assert m.run(10**6).status == "done"
    assert seen == ["other", *range(n)]


def test_finished_instances_are_freed_without_the_cyclic_collector() -> None:
    """A finished instance is no reference cycle: with the collector off, none is left once the mi is done."""
    program = wfsub.compile(mi(task(noop), count=1_000, collect="out"))
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        m = Machine(program)
        assert m.run(10**6).status == "done"
        left = sum(1 for obj in gc.get_objects() if type(obj) is InstanceFrame)
    finally:
        if was_enabled:
            gc.enable()
    assert left == 0


def _digesting(program: Any) -> Machine:
    m = Machine(program)
    m.digesting = True
    return m


def _varied(ctx: Mapping[str, Any]) -> dict[str, Any] | None:
    i = ctx["index"]
    return None if i % 3 == 0 else {"v": i, "s": f"x{i}", "f": i / 7, "l": [i, {"b": True, "a": None}]}


def test_a_durable_case_encodes_its_task_outputs_a_burst_at_a_time() -> None:
    """Between two records a digesting machine holds at most FOLD_AT raw outputs after a burst: the rest is text."""
    from wfsub._vm._machine import FOLD_AT

    m = _digesting(wfsub.compile(mi(task(noop), count=N, max=N)))
    while m.run(100).status == "yielded":
        outputs = m._vm.outputs
        assert outputs is not None and len(outputs) <= FOLD_AT + 1


def test_the_folded_digest_is_the_one_shot_digest(monkeypatch: Any) -> None:
    """Outputs encoded burst by burst (and through a snapshot) digest to the same value, naming the same tasks."""
    from wfsub._vm import _machine

    program = wfsub.compile(seq(task(lambda c: {"x": 1}, name="first"), mi(task(_varied), count=N, max=N)))
    m = _digesting(program)
    bursts = 0
    while m.run(100).status == "yielded":
        bursts += 1
        if bursts == 150:  # mid-way: through a snapshot (JSON and back), folded outputs included
            m = Machine.restore(program, json.loads(json.dumps(m.snapshot())))
    folded_digest, folded_paths = m.take_digest()

    monkeypatch.setattr(_machine, "FOLD_AT", 10**9)
    one = _digesting(program)
    assert one.run(10**9).status == "done"
    assert one._vm.outputs is not None and len(one._vm.outputs) == N + 1  # nothing folded: the one-shot encoding
    digest, paths = one.take_digest()
    assert folded_digest == digest
    assert list(folded_paths) == list(paths) and len(paths) == N + 1
    assert m.take_digest() == (digest, [])


def test_add_instances_of_many_items_starts_a_chunk_at_a_time() -> None:
    """Machine.add_instances of many items starts one chunk at once; the mi's spawner starts the rest, step by step."""
    m = Machine(wfsub.compile(mi(task(noop), items=lambda c: [], dynamic="open", name="big", collect="out")),
                max_instances=N)
    assert m.run(100).status == "blocked"
    m.add_instances("big", list(range(N)))
    frame = _mi_frame(m)
    assert frame is not None and frame.count <= SPAWN_CHUNK + 1 and frame.pending == N - SPAWN_CHUNK
    most = 0
    while m.run(100).status == "yielded":
        frame = _mi_frame(m)
        most = max(most, frame.count if frame is not None else 0)
    assert most <= 2 * SPAWN_CHUNK + 1
    m.close_instances("big")
    assert m.run(100).status == "done"
    assert m.data["out"] == [{}] * N


def test_items_added_while_count_instances_still_start_queue_behind_them() -> None:
    """Items added while a big count= mi still starts its instances get the next indexes; none is lost or doubled."""
    n = 3 * SPAWN_CHUNK

    def seen(ctx: Mapping[str, Any]) -> dict[str, Any]:
        return {"i": ctx["index"], "it": ctx.get("item", "-")}

    m = Machine(wfsub.compile(mi(task(seen), count=n, dynamic=True, name="big", collect="out")))
    assert m.run(1).status == "yielded"  # the first chunk started, the spawner queued behind it
    m.add_instances("big", ["a", "b"])
    assert m.run(10**6).status == "done"
    assert m.data["out"] == [{"i": i, "it": "-"} for i in range(n)] + [{"i": n, "it": "a"}, {"i": n + 1, "it": "b"}]


def test_instances_without_output_add_no_object_per_instance_to_the_collected_list() -> None:
    """Instances that return nothing are collected as one shared empty dict: no object per instance to walk."""
    m = Machine(wfsub.compile(mi(task(noop), count=1_000, collect="out")))
    assert m.run(10**6).status == "done"
    out = m.data["out"]
    assert out == [{}] * 1_000 and len({id(o) for o in out}) == 1

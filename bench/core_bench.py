"""Benchmarks of the pure core (compiler and vm), each beside a baseline measured in the same run.

Times are the best of several repetitions (the least disturbed one); ratios to the same-run baseline are
what to compare across machines.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import wfsub
from wfsub import effect, mi, par, scope, seq, task, xor
from wfsub._terms import Term
from wfsub._validate import children
from wfsub.lowlevel import Machine

from ._figures import record


def noop(ctx: Mapping[str, Any]) -> None:
    return None


def is_even(ctx: Mapping[str, Any]) -> bool:
    return True


async def parked(ctx: Mapping[str, Any]) -> None:
    return None


def best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def timed(setup: Callable[[], Any], run: Callable[[Any], Any]) -> Callable[[], float]:
    def once() -> float:
        state = setup()
        gc.collect()
        start = time.perf_counter()
        run(state)
        return time.perf_counter() - start

    return once


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def count_nodes(term: object) -> int:
    if not isinstance(term, Term):
        return 0
    return 1 + sum(count_nodes(child) for _, child in children(term))


def bench_sequence(lines: list[str]) -> None:
    n = 20_000
    program = wfsub.compile(seq(*[task(noop) for _ in range(n)]))

    def run_vm(m: Machine) -> None:
        assert m.run(10**9).status == "done"

    vm = record("seq_20k_tasks_ms", best(timed(lambda: Machine(program), run_vm), 15) * 1e3, "ms") / 1e3
    table: tuple[Callable[[Any], Any], ...] = (noop,)
    ops = [0] * n

    def run_loop(_: Any) -> None:
        for i in range(n):
            table[ops[i]](None)

    base = best(timed(lambda: None, run_loop), 15)
    rate = n / vm
    ratio = vm / base
    lines.append(
        f"seq of {n:,} no-op tasks        {rate / 1e6:6.2f} M task steps/s (target >= 1.00 M)  "
        f"{verdict(rate >= 1e6)}"
    )
    lines.append(
        f"  vs dispatch-table loop        vm {vm * 1e3:6.2f} ms, bare loop {base * 1e3:6.2f} ms: "
        f"{ratio:4.1f}x (target <= 5x)  {verdict(ratio <= 5)}"
    )


def bench_mi(lines: list[str]) -> None:
    per: dict[int, float] = {}
    for n, target_ms, repeat in ((1_000, 3.0, 30), (100_000, 400.0, 5)):
        program = wfsub.compile(mi(task(noop), count=n))

        def run_vm(m: Machine) -> None:
            assert m.run(10**9).status == "done"

        vm = best(timed(lambda program=program: Machine(program), run_vm), repeat)
        record(f"mi_{n}_ms", vm * 1e3, "ms")

        def run_base(_: Any, n: int = n) -> None:
            ready: deque[list[Any]] = deque([[i, None] for i in range(n)])
            outputs = [None] * n
            while ready:
                rec = ready.popleft()
                noop(rec)
                outputs[rec[0]] = rec[1]

        base = best(timed(lambda: None, run_base), repeat)
        per[n] = vm / n
        lines.append(
            f"mi wait-all of {n:>7,} no-op      {vm * 1e3:8.2f} ms (target <= {target_ms:g} ms)  "
            f"{verdict(vm * 1e3 <= target_ms)}   bare spawn/run/collect loop {base * 1e3:7.2f} ms "
            f"({vm / base:4.1f}x)"
        )
    growth = per[100_000] / per[1_000]
    lines.append(
        f"  per-instance cost 100,000 vs 1,000: {per[100_000] * 1e6:.2f} us vs {per[1_000] * 1e6:.2f} us "
        f"= {growth:4.2f}x (target <= 1.5x)  {verdict(growth <= 1.5)}"
    )


def bench_cancel(lines: list[str]) -> None:
    times: dict[int, float] = {}
    for n in (10_000, 100_000):
        program = wfsub.compile(scope("work", mi(effect(parked), count=n)))

        def setup(program: Any = program) -> Machine:
            m = Machine(program)
            m.run(10**9)
            return m

        def run_cancel(m: Machine, n: int = n) -> None:
            m.cancel_region("work")
            r = m.run(10)
            assert len(r.cancelled_effects) == n

        times[n] = best(timed(setup, run_cancel), 5 if n == 10_000 else 3)
        record(f"cancel_region_{n}_ms", times[n] * 1e3, "ms")

    def base_setup() -> dict[int, list[Any]]:
        return {i: [i, True] for i in range(10_000)}

    def base_run(table: dict[int, list[Any]]) -> None:
        cancelled = []
        for key in list(table):
            rec = table.pop(key)
            rec[1] = False
            cancelled.append(key)

    base = best(timed(base_setup, base_run), 5)
    growth = times[100_000] / times[10_000]
    lines.append(
        f"cancel_region, 10,000 live tokens  {times[10_000] * 1e3:6.2f} ms (target <= 20 ms)  "
        f"{verdict(times[10_000] <= 0.020)}   bare pop-and-flag loop {base * 1e3:5.2f} ms ({times[10_000] / base:4.1f}x)"
    )
    lines.append(
        f"  100,000 tokens {times[100_000] * 1e3:7.2f} ms = {growth:4.1f}x the time for 10x the tokens "
        f"(target <= 12x)  {verdict(growth <= 12)}"
    )


def big_term() -> Term:
    blocks = [
        par(task(noop), seq(task(noop), task(noop)), xor((is_even, task(noop)), default=task(noop)))
        for _ in range(1250)
    ]
    return seq(*blocks)


def bench_compile(lines: list[str]) -> None:
    term = big_term()
    nodes = count_nodes(term)
    compile_time = best(timed(lambda: None, lambda _: wfsub.compile(term)), 5)
    record("compile_10k_nodes_ms", compile_time * 1e3, "ms")
    walk = best(timed(lambda: None, lambda _: count_nodes(term)), 5)
    lines.append(
        f"compile of a {nodes:,}-node term    {compile_time * 1e3:6.1f} ms (target <= 200 ms)  "
        f"{verdict(compile_time <= 0.2)}   bare recursive walk {walk * 1e3:5.1f} ms ({compile_time / walk:4.1f}x)"
    )


def bench_memory(lines: list[str]) -> None:
    n = 100_000
    program = wfsub.compile(mi(effect(parked), count=n))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    m = Machine(program)
    result = m.run(10**9)
    assert result.status == "blocked" and len(result.effects) == n
    per_instance = record("mi_parked_bytes_per_instance", (tracemalloc.get_traced_memory()[0] - before) / n, "B")
    del result
    tracemalloc.stop()
    del m
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    base = [{"item": None, "index": i} for i in range(n)]
    per_base = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()
    del base
    lines.append(
        f"mi of {n:,} parked on an effect  {per_instance:6.0f} B/instance incl. effect requests "
        f"(target <= 600 B)  {verdict(per_instance <= 600)}   one bare dict per instance {per_base:4.0f} B"
    )


def run() -> list[str]:
    lines = ["== core (compiler and vm) =="]
    for bench in (bench_sequence, bench_mi, bench_cancel, bench_compile, bench_memory):
        bench(lines)
    return lines

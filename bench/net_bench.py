"""Benchmarks of nets, each beside a baseline measured in the same run.

- A chain of 1,000 net nodes against a `seq` of the same 1,000 tasks: plain nodes (one unconditional edge into an
  xor-join node that cannot reach an OR-join) are laid out back to back and cost nothing per node.
- An OR-join fed by 100 parallel branches: the cost of one join evaluation (a scan of the reachable set of an
  empty incoming edge, stopping at the first occupied place; here that place is the last of its set, so the whole
  set is scanned) at three net sizes, to show it grows no faster than the net; and the whole run of the 100 tokens
  arriving at the join one by one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import wfsub
from wfsub import effect, net, seq, task
from wfsub._vm._net import NetFrame
from wfsub.lowlevel import Machine

from ._figures import record
from .core_bench import best, timed, verdict


def noop(ctx: Mapping[str, Any]) -> None:
    return None


async def parked(ctx: Mapping[str, Any]) -> None:
    return None


def run_to_end(m: Machine) -> None:
    assert m.run(10**9).status == "done"


def bench_chain(lines: list[str]) -> None:
    n = 1_000
    names = [f"n{i}" for i in range(n)]
    edges = [("start", names[0]), *zip(names, names[1:]), (names[-1], "end")]
    chain = wfsub.compile(net({name: task(noop) for name in names}, edges))
    plain = wfsub.compile(seq(*[task(noop) for _ in range(n)]))
    net_time = base = float("inf")
    for _ in range(3):  # alternate the two, so drift in the machine's state hits both alike
        net_time = min(net_time, best(timed(lambda: Machine(chain), run_to_end), 100))
        base = min(base, best(timed(lambda: Machine(plain), run_to_end), 100))
    record("net_chain_1000_ms", net_time * 1e3, "ms")
    ratio = record("net_chain_vs_seq_x", net_time / base, "x")
    lines.append(
        f"net chain of {n:,} task nodes      {net_time * 1e6:7.1f} us; seq of the same {n:,} tasks {base * 1e6:7.1f} us: "
        f"{ratio:4.2f}x (target <= 1.5x)  {verdict(ratio <= 1.5)}"
    )


def or_net(size: int, branches: int = 100) -> Any:
    """start (and) -> `branches` chains of tasks, each ending in an effect -> one or-join `join` -> end."""
    length = max(1, size // branches)
    nodes: dict[str, Any] = {}
    edges: list[tuple[str, str]] = []
    for b in range(branches):
        chain = [f"b{b}_{i}" for i in range(length)]
        for i, name in enumerate(chain):
            nodes[name] = effect(parked, name=name) if i == length - 1 else task(noop)
        edges += [("start", chain[0]), *zip(chain, chain[1:]), (chain[-1], "join")]
    nodes["join"] = task(noop)
    edges.append(("join", "end"))
    return net(nodes, edges, join={"join": "or"})


def parked_machine(program: Any) -> Machine:
    """Every branch's token parked on its effect at the end of its chain."""
    m = Machine(program)
    assert m.run(10**9).status == "blocked"
    return m


def bench_or_join(lines: list[str]) -> None:
    per_eval: dict[int, float] = {}
    sizes = (1_000, 2_000, 4_000)
    for size in sizes:
        term = or_net(size)
        program = wfsub.compile(term)
        m = parked_machine(program)
        m.complete_effect(m.effect_ids()[0], None)  # one token reaches the join; the 99 others are upstream
        m.run(10**9)
        frame = m._vm.root.head
        assert isinstance(frame, NetFrame)
        j = frame.spec.names.index("join")
        assert not frame.can_fire(j)  # it waits: the empty edges' branches still hold their tokens
        calls = 20_000

        def evaluate(_: Any, frame: NetFrame = frame, j: int = j, calls: int = calls) -> None:
            for _ in range(calls):
                frame.can_fire(j)

        per_eval[size] = best(timed(lambda: None, evaluate), 5) / calls
        record(f"net_or_eval_{size}_us", per_eval[size] * 1e6, "us")
        nodes = len(frame.spec.names)
        if size == sizes[0]:
            evaluations = count_evaluations(program)

            def arrive_all(m: Machine) -> None:
                for eid in m.effect_ids():
                    m.complete_effect(eid, None)
                    m.run(10**9)
                assert m.status == "done"

            whole = best(timed(lambda program=program: parked_machine(program), arrive_all), 5)
            record("net_or_100_tokens_ms", whole * 1e3, "ms")
            lines.append(
                f"or-join of {nodes:,} nodes, 100 tokens  {per_eval[size] * 1e6:6.2f} us per join evaluation; "
                f"100 arrivals one by one {whole * 1e3:6.2f} ms ({evaluations} evaluations)"
            )
        else:
            lines.append(f"  at {nodes:,} nodes                  {per_eval[size] * 1e6:6.2f} us per join evaluation")
    growth = per_eval[sizes[-1]] / per_eval[sizes[0]]
    linear = sizes[-1] / sizes[0]
    slope = (per_eval[sizes[-1]] - per_eval[sizes[0]]) / (sizes[-1] - sizes[0]) * 100  # per place of a reach set
    lines.append(
        f"  per-evaluation cost {sizes[-1]:,} vs {sizes[0]:,} nodes: {growth:4.2f}x for {linear:.0f}x the nodes "
        f"(target <= linear, {linear:.0f}x)  {verdict(growth <= linear)}   "
        f"a fixed part plus {slope * 1e9:4.1f} ns per place scanned (each empty edge's set is 1/100 of the net)"
    )


def count_evaluations(program: Any) -> int:
    """How many join evaluations the 100 arrivals cost (counted on a separate, untimed run)."""
    calls = 0
    original = NetFrame.can_fire

    def counting(self: NetFrame, j: int) -> bool:
        nonlocal calls
        calls += 1
        return original(self, j)

    NetFrame.can_fire = counting  # type: ignore[method-assign]
    try:
        m = parked_machine(program)
        for eid in m.effect_ids():
            m.complete_effect(eid, None)
            m.run(10**9)
    finally:
        NetFrame.can_fire = original  # type: ignore[method-assign]
    return calls


def bench_compile(lines: list[str]) -> None:
    term = or_net(1_000)
    start = time.perf_counter()
    wfsub.compile(term)
    took = time.perf_counter() - start
    record("net_or_compile_1000_ms", took * 1e3, "ms")
    lines.append(f"compile of that 1,001-node net    {took * 1e3:6.1f} ms (reachable sets included)")


def run() -> list[str]:
    lines = ["== nets =="]
    for bench in (bench_chain, bench_or_join, bench_compile):
        bench(lines)
    return lines

"""wfsub beside peer engines on the same workloads, on this machine, in one run (`make bench-peers`).

- durable: N three-step workflows (each step returns a small dict) started one after another by one coroutine,
  then awaited: wfsub with a SQLite store (WAL, synchronous=FULL) beside DBOS Transact with its SQLite system
  database (rollback journal, synchronous=FULL: SQLite's defaults, which DBOS keeps), each on a new file in a
  temporary folder. "ms per step" is the run's time over its 3N steps (the inverse of the step rate).
- sequence: cases of K steps, each setting one key of the case data, run one case after another: wfsub (no store)
  through a Substrate and through its vm alone (`wfsub.lowlevel.Machine`), beside SpiffWorkflow running a BPMN
  chain of K script tasks to its end (`BpmnWorkflow(spec).do_engine_steps()`, as its docs run engine tasks; a
  script task is how a BPMN process runs a step of Python, its source run by SpiffWorkflow's script engine).
- multi-instance: cases of one multi-instance task of M instances, each setting one key: wfsub's
  `mi(task(...), count=M)` beside a SpiffWorkflow parallel multi-instance script task with loopCardinality M.

The BPMN is parsed and the wfsub terms compiled once, outside the times. The sides alternate round after round,
so that drift in the machine's state hits both alike; each figure is the best round, and the ratios are what to
compare across machines. The peers are the optional `peers` extra: one that is not installed or fails prints
"not run" with the reason, and the wfsub figures print all the same.
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio

import wfsub
from wfsub import Substrate, mi, seq, task
from wfsub.lowlevel import Machine

from ._figures import record
from .durable_bench import throughput as wfsub_durable

N_DURABLE = 200
# SpiffWorkflow's parser recurses once per task along a chain: a chain of 1,000 tasks exceeds Python's default
# recursion limit (RecursionError while parsing), so the sequence is 100 long.
K_SEQUENCE = 100
MI_SIZES = ((100, 100, 20, 5), (1_000, 20, 2, 3))  # (instances, wfsub cases and SpiffWorkflow cases a round, rounds)
DURABLE_ROUNDS = 3


class Side:
    """One side of a comparison: its time in each round, or why it did not run (then it is not tried again)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.times: list[float] = []
        self.reason: str | None = None

    def attempt(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or None once this side has failed (the first failure's reason is kept)."""
        if self.reason is not None:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # a peer that fails is reported, never fatal: this suite is optional
            first = (str(exc).strip().splitlines() or [""])[0]
            self.reason = f"{type(exc).__name__}: {first[:160]}"
            return None

    def run(self, fn: Callable[..., float], *args: Any) -> None:
        took = self.attempt(fn, *args)
        if took is not None:
            self.times.append(took)

    @property
    def best(self) -> float | None:
        return min(self.times) if self.times and self.reason is None else None

    def not_run(self) -> str:
        return f"{self.name}: not run ({self.reason})"


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def peer(dist: str, label: str) -> Side:
    installed = version(dist)
    return Side(label if installed == "not installed" else f"{label} {installed}")


# -- durable: wfsub with a store beside DBOS --------------------------------------------------------------------


def dbos_durable(path: Path, n: int) -> float:
    from . import _dbos_app  # the optional extra: imported only here, so a missing peer is one "not run"

    return _dbos_app.throughput(path, n)


def bench_durable(lines: list[str]) -> None:
    ours, dbos = Side("wfsub"), peer("dbos", "DBOS")
    with tempfile.TemporaryDirectory(prefix="wfsub-bench-peers-") as folder:
        tmp = Path(folder)
        for i in range(DURABLE_ROUNDS):  # interleaved: drift hits both alike
            ours.run(anyio.run, wfsub_durable, tmp / f"wfsub-{i}.db", N_DURABLE)
            dbos.run(dbos_durable, tmp / f"dbos-{i}.sqlite", N_DURABLE)
    assert ours.best is not None, ours.reason

    def rate(seconds: float) -> str:
        return f"{N_DURABLE / seconds:7,.0f} workflows/s ({seconds / (3 * N_DURABLE) * 1e3:6.2f} ms/step)"

    record("peers_durable_us_per_case", ours.best / N_DURABLE * 1e6, "us")
    line = f"{f'durable, {N_DURABLE} three-step workflows':<40} wfsub {rate(ours.best)}   "
    if dbos.best is None:
        lines.append(line + dbos.not_run())
        return
    record("peers_durable_vs_dbos", ours.best / dbos.best, "x")
    lines.append(line + f"{dbos.name} {rate(dbos.best)}   wfsub {dbos.best / ours.best:5.1f}x DBOS's rate")


# -- SpiffWorkflow: a chain of script tasks and a parallel multi-instance script task ------------------------------

BPMN_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" id="peers" targetNamespace="http://bpmn.io/schema/bpmn">\n'
)


def bpmn_chain(k: int) -> str:
    """start -> k script tasks (`x = i`) -> end, as one executable process `chain`."""
    nodes = ['<bpmn:startEvent id="start"><bpmn:outgoing>f0</bpmn:outgoing></bpmn:startEvent>']
    flows = []
    for i in range(k):
        nodes.append(
            f'<bpmn:scriptTask id="t{i}"><bpmn:incoming>f{i}</bpmn:incoming><bpmn:outgoing>f{i + 1}</bpmn:outgoing>'
            f"<bpmn:script>x = {i}</bpmn:script></bpmn:scriptTask>"
        )
        flows.append(f'<bpmn:sequenceFlow id="f{i}" sourceRef="{"start" if i == 0 else f"t{i - 1}"}" targetRef="t{i}"/>')
    nodes.append(f'<bpmn:endEvent id="end"><bpmn:incoming>f{k}</bpmn:incoming></bpmn:endEvent>')
    flows.append(f'<bpmn:sequenceFlow id="f{k}" sourceRef="t{k - 1}" targetRef="end"/>')
    body = "\n".join(nodes + flows)
    return f'{BPMN_HEAD}<bpmn:process id="chain" isExecutable="true">\n{body}\n</bpmn:process>\n</bpmn:definitions>\n'


def bpmn_multi_instance(m: int) -> str:
    """start -> one parallel multi-instance script task (`x = 1`, loopCardinality m) -> end, as process `each`."""
    return (
        f'{BPMN_HEAD}<bpmn:process id="each" isExecutable="true">\n'
        '<bpmn:startEvent id="start"><bpmn:outgoing>f0</bpmn:outgoing></bpmn:startEvent>\n'
        '<bpmn:scriptTask id="body"><bpmn:incoming>f0</bpmn:incoming><bpmn:outgoing>f1</bpmn:outgoing>\n'
        '<bpmn:multiInstanceLoopCharacteristics isSequential="false">'
        f'<bpmn:loopCardinality xsi:type="bpmn:tFormalExpression">{m}</bpmn:loopCardinality>'
        "</bpmn:multiInstanceLoopCharacteristics>\n"
        "<bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>\n"
        '<bpmn:endEvent id="end"><bpmn:incoming>f1</bpmn:incoming></bpmn:endEvent>\n'
        '<bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="body"/>\n'
        '<bpmn:sequenceFlow id="f1" sourceRef="body" targetRef="end"/>\n'
        "</bpmn:process>\n</bpmn:definitions>\n"
    )


def spiff_spec(xml: str, process: str) -> Any:
    from SpiffWorkflow.bpmn.parser import BpmnParser

    parser = BpmnParser()
    parser.add_bpmn_str(xml.encode())  # lxml takes a document with an encoding declaration only as bytes
    return parser.get_spec(process)


def spiff_cases(spec: Any, cases: int, check: Callable[[Mapping[str, Any]], bool]) -> float:
    """Seconds for `cases` workflows of `spec`, one after another, each run by the engine to its end."""
    from SpiffWorkflow.bpmn import BpmnWorkflow

    gc.collect()
    start = time.perf_counter()
    for _ in range(cases):
        workflow = BpmnWorkflow(spec)
        workflow.do_engine_steps()
        assert workflow.is_completed() and check(workflow.data), workflow.data
    return time.perf_counter() - start


# -- wfsub: the same cases through a Substrate and through the vm alone --------------------------------------------


def _setter(i: int) -> Callable[[Mapping[str, Any]], dict[str, int]]:
    def set_x(ctx: Mapping[str, Any]) -> dict[str, int]:
        return {"x": i}

    return set_x


async def substrate_cases(workflow: wfsub.Term, cases: int, check: Callable[[Mapping[str, Any]], bool]) -> float:
    """Seconds for `cases` cases of `workflow`, one after another, each started and awaited (the Substrate is
    entered outside the time)."""
    async with Substrate(workflows={"bench": workflow}) as sub:
        await (await sub.new_case("bench")).result()  # the compile is cached per workflow, as in a live service
        gc.collect()
        start = time.perf_counter()
        for _ in range(cases):
            data = await (await sub.new_case("bench")).result()
            assert check(data), data
        return time.perf_counter() - start


def machine_cases(program: Any, cases: int) -> float:
    gc.collect()
    start = time.perf_counter()
    for _ in range(cases):
        assert Machine(program).run(10**9).status == "done"
    return time.perf_counter() - start


@dataclass(frozen=True)
class Workload:
    """One workload for both engines: `size` steps (or instances) per case; wfsub runs more cases per round than
    SpiffWorkflow so that its rounds are long enough to time (the figures are per case)."""

    label: str
    key: str
    unit: str
    size: int
    workflow: wfsub.Term
    bpmn: tuple[str, str]  # (the XML, the process id)
    check: Callable[[Mapping[str, Any]], bool]  # on a case's final data, on either engine
    wfsub_cases: int
    spiff_cases: int
    rounds: int


def compare(lines: list[str], w: Workload) -> None:
    """One line: w's cases on wfsub (Substrate, and vm alone) beside SpiffWorkflow, each the best of w.rounds."""
    program = wfsub.compile(w.workflow)
    ours, vm = Side("wfsub"), Side("wfsub vm")
    spiff = peer("SpiffWorkflow", "SpiffWorkflow")
    spec = spiff.attempt(spiff_spec, *w.bpmn)
    for _ in range(w.rounds):  # interleaved: drift hits all three alike
        ours.run(anyio.run, substrate_cases, w.workflow, w.wfsub_cases, w.check)
        vm.run(machine_cases, program, w.wfsub_cases)
        spiff.run(spiff_cases, spec, w.spiff_cases, w.check)
    assert ours.best is not None and vm.best is not None, (ours.reason, vm.reason)
    case, vm_case = ours.best / w.wfsub_cases, vm.best / w.wfsub_cases
    record(f"peers_{w.key}_us_per_case", case * 1e6, "us")
    line = (
        f"{w.label:<40} wfsub {case * 1e3:7.3f} ms/case ({case / w.size * 1e6:5.2f} us/{w.unit}, vm alone "
        f"{vm_case / w.size * 1e6:5.2f})   "
    )
    if spiff.best is None:
        lines.append(line + spiff.not_run())
        return
    theirs = spiff.best / w.spiff_cases
    record(f"peers_{w.key}_vs_spiff", case / theirs, "x")
    lines.append(
        line + f"{spiff.name} {theirs * 1e3:8.2f} ms/case ({theirs / w.size * 1e6:6.1f} us/{w.unit})   "
        f"wfsub {theirs / case:5,.0f}x faster (vm alone {theirs / vm_case:5,.0f}x)"
    )


def bench_sequence(lines: list[str]) -> None:
    last = K_SEQUENCE - 1
    compare(lines, Workload(
        label=f"sequence of {K_SEQUENCE} steps, case by case", key=f"seq_{K_SEQUENCE}", unit="step", size=K_SEQUENCE,
        workflow=seq(*[task(_setter(i), name=f"t{i}") for i in range(K_SEQUENCE)]),
        bpmn=(bpmn_chain(K_SEQUENCE), "chain"), check=lambda data: data.get("x") == last,
        wfsub_cases=200, spiff_cases=20, rounds=5,
    ))


def bench_mi(lines: list[str]) -> None:
    for m, wfsub_cases, spiff_cases, rounds in MI_SIZES:
        compare(lines, Workload(
            label=f"multi-instance of {m:,}, case by case", key=f"mi_{m}", unit="instance", size=m,
            workflow=mi(task(_setter(1), name="body"), count=m),
            bpmn=(bpmn_multi_instance(m), "each"), check=lambda data: True,  # completion is checked on each side
            wfsub_cases=wfsub_cases, spiff_cases=spiff_cases, rounds=rounds,
        ))


def run() -> list[str]:
    lines = [
        f"== peers (wfsub {version('wfsub')}, DBOS {version('dbos')}, SpiffWorkflow {version('SpiffWorkflow')}; "
        "same machine, same run) =="
    ]
    for bench in (bench_durable, bench_sequence, bench_mi):
        bench(lines)
    return lines


if __name__ == "__main__":
    for line in run():
        print(line)

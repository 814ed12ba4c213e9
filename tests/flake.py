"""`python -m tests.flake --runs N [--burners K] [-- PYTEST_ARGS]` (what `make flake N=20` runs): the whole suite
N times, each run in an order drawn from a seed of its own (`--shuffle`), every second run beside K processes
that keep a core busy, then each test that failed at least once, with its count and the seeds of the runs where
it failed, so the next flaky test is found on purpose, not by CI.

A run's failures are read from its JUnit XML report, beside its output, in --workdir (a temporary folder by
default); a crash of the runner itself shows as a run with no report. Exits 1 if any test failed in any run.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import random
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

DEFAULT_PYTEST_ARGS = ["-q", "-n", "2", "--dist", "worksteal", "-p", "no:cacheprovider"]


def _burn() -> None:  # pragma: no cover - runs in a child process until it is terminated
    while True:
        pass


def failures(report: Path) -> list[str]:
    """The node ids of the tests that failed or errored in one JUnit XML report."""
    found = []
    for case in ET.parse(report).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            classname, name = case.get("classname", ""), case.get("name", "")
            found.append(f"{classname}::{name}" if classname else name)
    return found


def run_once(index: int, seed: int, burners: int, workdir: Path, pytest_args: list[str]) -> tuple[list[str], str]:
    """One run of the suite; the tests that failed and a line saying how the run went."""
    report = workdir / f"run-{index}.xml"
    procs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(burners)]
    for p in procs:
        p.start()
    started = time.monotonic()
    try:
        with (workdir / f"run-{index}.log").open("w") as log:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", *pytest_args, f"--shuffle={seed}", f"--junitxml={report}"],
                stdout=log, stderr=subprocess.STDOUT, check=False,
            )
    finally:
        for p in procs:
            p.terminate()
            p.join()
    took = time.monotonic() - started
    if not report.exists():
        return ["<the run wrote no report>"], f"run {index}: seed {seed}, exit {done.returncode}, no report"
    failed = failures(report)
    suite = ET.parse(report).getroot().find("testsuite")
    tests = suite.get("tests", "?") if suite is not None else "?"
    load = f", beside {burners} burners" if burners else ""
    return failed, f"run {index}: seed {seed}{load}, {tests} tests, {len(failed)} failed, {took:.0f} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.flake", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burners", type=int, default=2, help="busy processes beside every second run (0: none)")
    parser.add_argument("--seed", type=int, default=None, help="the first run's order seed (the next ones follow)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default: the suite on 2 workers)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="wfsub-flake-"))
    workdir.mkdir(parents=True, exist_ok=True)
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    pytest_args = args.pytest_args or DEFAULT_PYTEST_ARGS
    print(f"flake: {args.runs} runs from seed {first}, reports in {workdir}", flush=True)
    counts: collections.Counter[str] = collections.Counter()
    seeds: dict[str, list[int]] = collections.defaultdict(list)
    for index in range(1, args.runs + 1):
        seed = first + index - 1
        failed, line = run_once(index, seed, args.burners if index % 2 == 0 else 0, workdir, pytest_args)
        print(line, flush=True)
        for test in failed:
            counts[test] += 1
            seeds[test].append(seed)
    if not counts:
        print(f"flake: no test failed in {args.runs} runs")
        return 0
    print(f"flake: {len(counts)} tests failed at least once in {args.runs} runs:")
    for test, n in counts.most_common():
        print(f"  {n:3d}x {test}  (seeds {', '.join(map(str, seeds[test]))})")
    print("flake: `pytest --shuffle=SEED` runs the suite in a failed run's order")
    return 1


if __name__ == "__main__":
    sys.exit(main())

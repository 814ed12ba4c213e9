"""Compare the benchmark figures of the working tree with those of another commit, measured in the same run.

    python -m bench.compare HEAD~1 [--rounds 3] [--suites core runtime]

Both sides run the *current* benchmark code (`bench/`) against their own `wfsub/` package: the commit's package
is exported with `git archive` into a scratch directory. The two sides alternate, round after round, so drift in
the machine's state hits both alike; each figure keeps its best (lowest) value over the rounds. A figure more than
5% worse than the commit's is flagged. Each suite runs in a process of its own, so a suite the older package
cannot run (an API it does not have yet) only leaves its own figures as n/a.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .__main__ import SUITES

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.05


def _tree(dest: Path, ref: str | None) -> Path:
    """A directory holding `bench/` from the working tree and `wfsub/` from `ref` (None: the working tree)."""
    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "bench", dest / "bench")
    if ref is None:
        shutil.copytree(ROOT / "wfsub", dest / "wfsub")
    else:
        archive = subprocess.run(["git", "archive", ref, "wfsub"], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _run(tree: Path, suites: list[str]) -> dict[str, float]:
    figures: dict[str, float] = {}
    for suite in suites:
        out = tree / f"figures-{suite}.json"
        out.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "bench", suite, "--json", str(out)]
        done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
        if done.returncode != 0 or not out.exists():
            last = done.stderr.strip().splitlines()[-1:] or ["(no output)"]
            print(f"  ({tree.name}: suite {suite} did not run: {last[0]})", file=sys.stderr)
            continue
        figures.update({key: fig["value"] for key, fig in json.loads(out.read_text()).items()})
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the commit to compare with, e.g. HEAD~1")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--suites", nargs="*", default=list(SUITES))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        here = _tree(Path(scratch) / "working-tree", None)
        there = _tree(Path(scratch) / "ref", args.ref)
        best: dict[str, dict[str, float]] = {"new": {}, "old": {}}
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}/{args.rounds} ...", flush=True)
            for side, tree in (("old", there), ("new", here)) if round_ % 2 else (("new", here), ("old", there)):
                for key, value in _run(tree, args.suites).items():
                    best[side][key] = min(value, best[side].get(key, value))
    worse = 0
    print(f"\n{'figure':<34} {'working tree':>14} {args.ref:>14}   change")
    for key in sorted(best["new"]):
        new, old = best["new"][key], best["old"].get(key)
        if old is None:
            print(f"{key:<34} {new:14.3f} {'n/a':>14}")
            continue
        change = new / old - 1 if old else 0.0
        flag = "WORSE" if change > TOLERANCE else ""
        worse += bool(flag)
        print(f"{key:<34} {new:14.3f} {old:14.3f}   {change * 100:+6.1f}% {flag}")
    print(f"\n{worse} figure(s) more than {TOLERANCE:.0%} worse than {args.ref}" if worse else "\nno figure is worse by more than 5%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

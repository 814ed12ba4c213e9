"""`python -m tests.chaos [--seed N] [--minutes M] [--nodes K] [--keep]` (what `make chaos` runs), or
`python -m tests.chaos --check DIR` to check a kept run's work directory again.

A run spends 60% of its minutes injecting faults and at most the rest waiting for the workload to finish, then
checks; it prints the seed and the schedule first, each fault as it happens, then every violation with its
case and records, and exits 1 if there was one (the work directory, with every process's log and the history of
acknowledgements and effect attempts, is kept then). Without --seed the seed is drawn and printed.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from ._campaign import Settings, load_history, run
from ._checker import check, summarize
from ._server import ServerUnavailable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[1])
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work directory of a passing run too")
    parser.add_argument("--check", type=Path, default=None, metavar="DIR",
                        help="check a kept run's work directory again (no run)")
    args = parser.parse_args(argv)
    if args.check is not None:
        found = check(load_history(args.check))
        for v in found:
            print(v.render())
        print(f"{args.check}: {len(found)} violations {summarize(found)}")
        return 1 if found else 0
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    total = max(0.5, args.minutes) * 60
    settings = Settings(seed=seed, fault_seconds=round(total * 0.6, 1), quiet_seconds=round(total * 0.4, 1),
                        nodes=args.nodes, workdir=args.workdir, keep=args.keep, echo=sys.stdout)
    try:
        result = run(settings)
    except ServerUnavailable as exc:
        print(f"chaos campaign not run: {exc}", file=sys.stderr)
        return 2
    print("\n".join(result.report.splitlines()[len(_said(result.report)):]))
    if not result.ok:
        print(f"the run's files are in {result.workdir}")
    return 0 if result.ok else 1


def _said(report: str) -> list[str]:
    """The report's progress lines (already echoed as they happened)."""
    return [line for line in report.splitlines() if line.startswith("[")]


if __name__ == "__main__":
    sys.exit(main())

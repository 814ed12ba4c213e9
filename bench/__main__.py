"""Print every benchmark figure with its target and its same-run baseline.

    python -m bench                      every suite but the optional ones
    python -m bench core runtime         only these suites
    python -m bench --json figures.json  also write the recorded figures (for `python -m bench.compare`)
    python -m bench peers                wfsub beside peer engines (needs the `peers` extra: `make bench-peers`)
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys

from ._figures import FIGURES

SUITES = ("core", "runtime", "updates", "net", "store", "durable", "compaction", "children", "eviction", "postgres", "nodes", "processes", "import", "web", "queues")  # postgres prints why it skips without a server
OPTIONAL = ("peers",)  # run only when named: they need packages that `make bench` does not install


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("suites", nargs="*", choices=[*SUITES, *OPTIONAL, []],
                        help=f"suites to run (default: all but {', '.join(OPTIONAL)})")
    parser.add_argument("--json", metavar="PATH", help="write the recorded figures to PATH")
    args = parser.parse_args(argv)
    print(f"wfsub benchmarks on Python {platform.python_version()} ({platform.machine()})")
    failed = 0
    for suite in args.suites or SUITES:
        module = importlib.import_module(f"bench.{suite}_bench")
        for line in module.run():
            print(line, flush=True)
            failed += line.rstrip().endswith("FAIL") or " FAIL " in line
    print(f"{failed} figure(s) missed their target" if failed else "every figure met its target")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({key: {"value": v, "unit": u} for key, (v, u) in FIGURES.items()}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

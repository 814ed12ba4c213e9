"""Print every benchmark figure with its target and its same-run baseline."""

from __future__ import annotations

import importlib
import platform
import sys


def main() -> int:
    print(f"wfsub benchmarks on Python {platform.python_version()} ({platform.machine()})")
    failed = 0
    for name in ("bench.core_bench", "bench.runtime_bench"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            print(f"({name} not present)")
            continue
        for line in module.run():
            print(line, flush=True)
            failed += line.rstrip().endswith("FAIL") or " FAIL " in line
    print(f"{failed} figure(s) missed their target" if failed else "every figure met its target")
    return 0


if __name__ == "__main__":
    sys.exit(main())

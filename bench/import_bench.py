"""Start-up cost: `import wfsub` and `wfsub --help`, each in a fresh interpreter beside the bare interpreter.

Every figure is the wall time of a whole `python ...` process, the best of `WFSUB_BENCH_IMPORT_ROUNDS` runs
(default 10). The runs alternate (bare, import, help, first use of the runtime, then again), so drift in the
machine's state hits them alike. `import wfsub` is reported over `python -c pass` of the same run (what the
import adds); `wfsub --help` whole, since that is what a person waits for at the prompt. The processes run from
the directory above `bench/`, so they import that tree's `wfsub` (as `python -m bench.compare` arranges).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from ._figures import record

ROUNDS = int(os.environ.get("WFSUB_BENCH_IMPORT_ROUNDS", "10"))
ROOT = Path(__file__).resolve().parent.parent
IMPORT_TARGET_MS = 150.0  # `import wfsub`, over the bare interpreter
HELP_TARGET_MS = 250.0  # `wfsub --help`, the whole process

RUNS = {
    "bare": [sys.executable, "-c", "pass"],
    "import": [sys.executable, "-c", "import wfsub"],
    "help": [sys.executable, "-m", "wfsub", "--help"],
    "runtime": [sys.executable, "-c", "import wfsub; wfsub.Substrate"],
}


def _once(argv: list[str]) -> float:
    """Seconds for one process running `argv` to exit (it must succeed)."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:])} failed: {done.stderr.decode(errors='replace').strip()}")
    return took


def _which_wfsub() -> str:
    out = subprocess.run([sys.executable, "-c", "import wfsub; print(wfsub.__file__)"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    return str(Path(out).parent)


def measure(rounds: int = ROUNDS) -> dict[str, float]:
    """Best seconds per kind of run in `RUNS`, the kinds alternating round after round."""
    best = {name: float("inf") for name in RUNS}
    for _ in range(rounds):
        for name, argv in RUNS.items():
            best[name] = min(best[name], _once(argv))
    return best


def run() -> list[str]:
    package = _which_wfsub()
    lines = [f"== start-up (fresh processes, best of {ROUNDS}; wfsub from {package}) =="]
    if Path(package) != ROOT / "wfsub":
        lines.append(f"the processes import wfsub from {package}, not from {ROOT / 'wfsub'}: figures not recorded")
        return lines
    best = measure()
    bare = best["bare"] * 1e3  # printed beside the figures, not recorded: no change to wfsub moves it
    imported = record("import_wfsub_over_bare_ms", (best["import"] - best["bare"]) * 1e3, "ms")
    helped = record("wfsub_help_ms", best["help"] * 1e3, "ms")
    runtime = (best["runtime"] - best["bare"]) * 1e3
    lines.append(
        f"import wfsub                        {imported:6.1f} ms over bare (target <= {IMPORT_TARGET_MS:.0f}) "
        f"{'PASS' if imported <= IMPORT_TARGET_MS else 'FAIL'}   python -c pass {bare:6.1f} ms, "
        f"python -c 'import wfsub' {best['import'] * 1e3:6.1f} ms"
    )
    lines.append(
        f"wfsub --help (python -m wfsub)      {helped:6.1f} ms whole (target <= {HELP_TARGET_MS:.0f}) "
        f"{'PASS' if helped <= HELP_TARGET_MS else 'FAIL'}   python -c pass {bare:6.1f} ms, "
        f"{helped - bare:6.1f} ms over bare"
    )
    lines.append(
        f"import wfsub; wfsub.Substrate       {runtime:6.1f} ms over bare (no target: the runtime, anyio and "
        "pydantic, loaded on first use)"
    )
    return lines

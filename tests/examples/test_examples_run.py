"""The examples run as a user runs them, and say what they claim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parents[2] / "examples"


def run(name: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    # Nothing logged (the library is silent below WARNING); the wfsub command reports on stderr as CLIs do.
    assert [line for line in done.stderr.splitlines() if not line.startswith("done: ")] == [], done.stderr
    return done.stdout


@pytest.mark.long
def test_the_demo_recovers_its_orders_after_a_kill(tmp_path: Path) -> None:
    """`make demo`: the orders survive SIGKILL of the shop, the booking re-runs with its key, the cancel refunds."""
    out = run("order_flow.py", tmp_path)
    bookings = [line for line in out.splitlines() if "courier: booking a shipment for A-100" in line]
    assert len(bookings) == 2 and bookings[0] == bookings[1]  # the in-flight booking ran again, same key
    assert "A-100: confirmed, charged 49.0, tracking TRK-A-100" in out
    assert "A-101: cancelled (customer cancelled): refunded 30.0, released R-A-101" in out
    assert "A-102: confirmed by default, charged 320.0, tracking TRK-A-102" in out
    assert (tmp_path / ".demo" / "orders.db").exists()


def test_the_other_examples_run(tmp_path: Path) -> None:
    """embedded_app.py and review_process.py run to their end."""
    for name in ("embedded_app.py", "review_process.py"):
        assert run(name, tmp_path).strip()

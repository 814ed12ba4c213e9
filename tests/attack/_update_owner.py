"""An owner process for the attack tests: `python -m tests.attack._update_owner PATH` opens a Substrate on the
SQLite file PATH with the update workflow below, prints `ready`, and serves until its stdin closes (or it is
killed)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import anyio

from wfsub import Substrate, seq, wait


def total(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"total": ctx["add"]["n"] * 10}


ADDING = seq(wait("add", reply=total), wait("end"))


async def main(path: str) -> None:
    async with Substrate(store=path, workflows={"adding": ADDING}, trace_level="none", standby=False):
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1])

"""An owner process of the client tests: `python -m tests.processes._owner sqlite PATH` or
`python -m tests.processes._owner postgres DSN SCHEMA`. It runs the loan service's workflow on that store, prints
`ready` once its Substrate is open, and serves until its stdin closes."""

from __future__ import annotations

import sys

import anyio

from wfsub import Substrate

from ._app import loan


def store_of(argv: list[str]) -> object:
    if argv[0] == "sqlite":
        return argv[1]
    from wfsub.stores import PostgresStore

    return PostgresStore(argv[1], schema=argv[2])


async def main(argv: list[str]) -> None:
    async with Substrate(store=store_of(argv), workflows={"loan": loan}, trace_level="none", standby=False):
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])

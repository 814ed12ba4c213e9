"""The app of the processes bench's throughput figure: one Substrate per uvicorn worker on one SQLite file
(`BENCH_DB`), as `uvicorn bench._loans_app:app --workers N` runs it. One worker owns the file and runs every case;
the others are standbys that forward starts and signals through the store and await through it.

    POST /loans/{id}             start a loan (score, then wait for approval, then pay)
    POST /loans/{id}/approve     approve it
    GET  /loans/{id}/result      its final data (202 while it has not ended within ?timeout=)
    GET  /whoami                 this worker's pid and whether it is a standby
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from wfsub import Substrate, effect, seq, wait


async def score(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"score": int(ctx["amount"]) % 7}


async def pay(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"paid": ctx["amount"]}


LOAN = seq(effect(score), wait("approve"), effect(pay))


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with Substrate(store=os.environ["BENCH_DB"], workflows={"loan": LOAN}, trace_level="none") as sub:
        app.state.sub = sub
        yield


app = FastAPI(lifespan=lifespan)


@app.post("/loans/{case_id}", status_code=201)
async def start(case_id: str, request: Request) -> dict[str, Any]:
    await request.app.state.sub.new_case("loan", {"amount": 5}, case_id=case_id)
    return {"id": case_id}


@app.post("/loans/{case_id}/approve")
async def approve(case_id: str, request: Request) -> dict[str, Any]:
    await request.app.state.sub.signal(case_id, "approve", {"by": "bench"}, request_id=f"{case_id}-approve")
    return {"id": case_id}


@app.get("/loans/{case_id}/result")
async def result(case_id: str, request: Request, timeout: float = 30.0) -> Any:  # noqa: ASYNC109 (query parameter)
    try:
        return await request.app.state.sub.await_case(case_id, timeout=timeout)
    except TimeoutError:
        return JSONResponse({"error": "not ended"}, status_code=202)


@app.get("/whoami")
async def whoami(request: Request) -> dict[str, Any]:
    return {"pid": os.getpid(), "standby": request.app.state.sub.standby}

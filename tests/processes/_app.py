"""A loan service as a new user writes it: FastAPI, one Substrate per worker on one SQLite file, run by
`uvicorn tests.processes._app:app --workers N` (the store and the effect log are given in the environment).

    POST /loans                      {"id", "amount"}: start a loan (the same call again returns the same case)
    POST /loans/{id}/approve         {"by"}, with an optional ?request_id=: approve it
    POST /loans/{id}/cancel          cancel it
    GET  /loans/{id}                 its status
    GET  /loans/{id}/result          its final data, once it has ended (waits up to ?timeout= seconds)
    GET  /whoami                     this worker's pid and whether it is a standby

Every effect run appends one line to LOANS_LOG (`case effect pid key`), so a test can see who ran what.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

import wfsub
from wfsub import Substrate, effect, seq, wait


class Approval(BaseModel):
    by: str


def _log_run(name: str) -> None:
    info = wfsub.effect_info()
    line = json.dumps({"case": info.case_id, "effect": name, "pid": os.getpid(), "key": info.idempotency_key})
    fd = os.open(os.environ["LOANS_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())  # one write of one line with O_APPEND: lines never interleave
    finally:
        os.close(fd)


async def score(ctx: Mapping[str, Any]) -> dict[str, Any]:
    _log_run("score")
    return {"score": int(ctx["amount"]) % 7}


async def disburse(ctx: Mapping[str, Any]) -> dict[str, Any]:
    _log_run("disburse")
    return {"paid": ctx["amount"]}


loan = seq(effect(score), wait("approve", model=Approval), effect(disburse))


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with Substrate(store=os.environ["LOANS_DB"], workflows={"loan": loan}) as sub:
        app.state.sub = sub
        yield


app = FastAPI(lifespan=lifespan)


def _sub(request: Request) -> Substrate:
    sub: Substrate = request.app.state.sub
    return sub


@app.exception_handler(wfsub.WfsubError)
async def refused(request: Request, exc: wfsub.WfsubError) -> JSONResponse:
    status = 404 if isinstance(exc, wfsub.CaseNotFound) else 409
    return JSONResponse({"error": type(exc).__name__, "detail": str(exc)}, status_code=status)


class NewLoan(BaseModel):
    id: str
    amount: int


@app.post("/loans", status_code=201)
async def start(body: NewLoan, request: Request) -> dict[str, Any]:
    handle = await _sub(request).new_case("loan", {"amount": body.amount}, case_id=body.id)
    return {"id": handle.case_id}


@app.post("/loans/{case_id}/approve")
async def approve(case_id: str, body: Approval, request: Request, request_id: str | None = None) -> dict[str, Any]:
    await _sub(request).signal(case_id, "approve", body.model_dump(), request_id=request_id)
    return {"id": case_id}


@app.post("/loans/{case_id}/cancel")
async def cancel(case_id: str, request: Request) -> dict[str, Any]:
    await _sub(request).cancel(case_id, reason="withdrawn")
    return {"id": case_id}


@app.get("/loans/{case_id}")
async def status(case_id: str, request: Request) -> dict[str, Any]:
    return {"state": _sub(request).status(case_id).state.value}


@app.get("/loans/{case_id}/result")
async def result(case_id: str, request: Request, timeout: float = 10.0) -> Any:  # noqa: ASYNC109 (the query parameter)
    try:
        return await _sub(request).await_case(case_id, timeout=timeout)
    except TimeoutError:
        return JSONResponse({"error": "not ended"}, status_code=202)


@app.get("/whoami")
async def whoami(request: Request) -> dict[str, Any]:
    return {"pid": os.getpid(), "standby": _sub(request).standby}

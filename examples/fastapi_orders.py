"""An order service on FastAPI with one wfsub Substrate for the life of the app.

    uvicorn examples.fastapi_orders:app          (pip install fastapi uvicorn; cases in orders.db)

    POST /orders                          start an order (201, also for the same order sent again; 409 if the id
                                          is another order's; 422 if the body is bad)
    GET  /orders?state=&limit=            the orders, newest first
    GET  /orders/{id}                     where it is: state, threads, waits, error (404 if unknown)
    GET  /orders/{id}/data                its data now (the final data once ended)
    GET  /orders/{id}/trace               its trace, replayed from its journal
    POST /orders/{id}/signals/{name}      send a signal; the JSON body is the payload (409 if the case cannot take
                                          it now; 422 if the payload does not fit the wait's model)
    POST /orders/{id}/cancel?reason=      cancel it, compensating what was paid (409 once ended)

The Substrate is entered in the lifespan, so cases survive a restart of the service: they are in the store.
Errors map from wfsub's exceptions in one place (`ERRORS`), and every refusal says what to do.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import wfsub
from wfsub import CaseState, CaseStatus, Substrate, effect, saga, seq, task, wait

# -- the workflow -----------------------------------------------------------------------------------------------


class Line(BaseModel):
    sku: str = Field(min_length=1)
    qty: int = Field(gt=0)
    price: float = Field(ge=0)


class NewOrder(BaseModel):
    # An id the routes can address: letters, digits and - _ . (no spaces, no '/').
    order_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    lines: list[Line] = Field(min_length=1)


class Approval(BaseModel):
    """What the `approve` signal carries: checked when it is sent (a bad one is refused with 422)."""

    by: str = Field(min_length=1)


class Order(BaseModel):
    """The final data of a completed order: `result(model=Order)` checks it."""

    order_id: str
    total: float
    payment: str
    tracking: str
    status: str


def price(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"total": round(sum(line["qty"] * line["price"] for line in ctx["lines"]), 2)}


async def charge(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"payment": f"P-{ctx['order_id']}"}


async def refund(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"refunded": ctx["total"]}


async def ship(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"tracking": f"TRK-{ctx['order_id']}", "status": "shipped"}


# Price the order; charge the card (refunded if the order is cancelled before it ships); wait for a person's
# approval (its payload typed: Approval); ship.
ORDER = seq(task(price), saga((effect(charge), effect(refund)), wait("approve", model=Approval)), effect(ship))
WORKFLOWS = {"order": ORDER}

# -- errors: one table from wfsub's exceptions to HTTP ----------------------------------------------------------

ERRORS: dict[type[Exception], int] = {
    wfsub.CaseNotFound: 404,
    wfsub.CaseExists: 409,
    wfsub.SignalRejected: 409,  # ended case, unknown signal (422 when the payload does not fit its model)
    wfsub.CaseCancelled: 409,  # the result of an order that was cancelled: it will never ship
    wfsub.CaseFailed: 409,  # ... or that failed
    wfsub.WorkflowNotRegistered: 404,
}


async def _error(request: Request, exc: Exception) -> JSONResponse:
    status = next(code for kind, code in ERRORS.items() if isinstance(exc, kind))
    body: dict[str, Any] = {"detail": str(exc)}
    if isinstance(exc, wfsub.SignalRejected) and exc.errors:
        status, body["errors"] = 422, exc.errors  # pydantic's errors, as FastAPI reports its own
    if isinstance(exc, wfsub.CaseNotFound):
        body["detail"] = f"no order {exc.case_id!r}: GET /orders lists them"
    return JSONResponse(body, status_code=status)


# -- the app ----------------------------------------------------------------------------------------------------


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with Substrate(store=os.environ.get("ORDERS_STORE", "orders.db"), workflows=WORKFLOWS) as sub:
        app.state.sub = sub
        yield


app = FastAPI(title="orders", lifespan=lifespan)
for _kind in ERRORS:
    app.add_exception_handler(_kind, _error)


def _sub(request: Request) -> Substrate:
    sub: Substrate = request.app.state.sub
    return sub


class Started(BaseModel):
    case_id: str


@app.post("/orders", status_code=201)
async def start_order(request: Request, order: NewOrder) -> Started:
    handle = await _sub(request).new_case("order", order, case_id=order.order_id)
    return Started(case_id=handle.case_id)


@app.get("/orders")
async def list_orders(
    request: Request,
    state: CaseState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[CaseStatus]:
    return _sub(request).cases(state=state, workflow="order", limit=limit)


@app.get("/orders/{case_id}")
async def order_status(request: Request, case_id: str) -> CaseStatus:
    return _sub(request).status(case_id)


@app.get("/orders/{case_id}/data")
async def order_data(request: Request, case_id: str) -> dict[str, Any]:
    return _sub(request).data(case_id)


@app.get("/orders/{case_id}/result")
async def order_result(request: Request, case_id: str) -> Order:
    """The shipped order (409 while it runs: poll GET /orders/{id})."""
    sub = _sub(request)
    try:
        done: Order = await sub.await_case(case_id, timeout=0, model=Order)
    except TimeoutError:
        return JSONResponse({"detail": f"order {case_id!r} is still running"}, status_code=409)  # type: ignore[return-value]
    return done


@app.get("/orders/{case_id}/trace")
async def order_trace(request: Request, case_id: str) -> list[wfsub.TraceEvent]:
    sub = _sub(request)
    return wfsub.replay(ORDER, await sub.journal(case_id), trace_level="min").events


@app.post("/orders/{case_id}/signals/{name}", status_code=202)
async def send_signal(
    request: Request, case_id: str, name: str, payload: Annotated[Any, Body()] = None
) -> dict[str, str]:
    try:
        await _sub(request).signal(case_id, name, payload)
    except ValueError as exc:  # larger than the store's max_payload_bytes
        return JSONResponse({"detail": str(exc)}, status_code=413)  # type: ignore[return-value]
    return {"detail": f"signal {name!r} recorded for order {case_id!r}"}


@app.post("/orders/{case_id}/cancel", status_code=202)
async def cancel_order(
    request: Request, case_id: str, reason: Annotated[str, Query(min_length=1)] = "cancelled by the customer"
) -> dict[str, str]:
    sub = _sub(request)
    if sub.status(case_id).ended:
        state = sub.status(case_id).state.value
        return JSONResponse(  # type: ignore[return-value]
            {"detail": f"order {case_id!r} has ended ({state}): nothing to cancel"}, status_code=409
        )
    # One cancel per order: a repeated request (a double click, a retry) is the same cancel, applied once, so it
    # cannot cut the refund short (a second, different cancel of a case ends it at once, without compensating).
    await sub.cancel(case_id, reason=reason, request_id=f"cancel-{case_id}")
    return {"detail": f"order {case_id!r} cancelled: {reason}"}

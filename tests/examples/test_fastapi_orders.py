"""The FastAPI example, driven end to end through httpx's ASGI transport (lifespan included)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType

import anyio
import httpx
import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "fastapi_orders.py"

def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_orders", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fastapi_orders"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def store_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's store, in the test's own directory."""
    monkeypatch.setenv("ORDERS_STORE", str(tmp_path / "orders.db"))


@asynccontextmanager
async def serving() -> AsyncIterator[httpx.AsyncClient]:
    """The app with its lifespan (one Substrate) and a client for it: used inside a test, not as a fixture, so
    the Substrate's task group is entered and left in the same task."""
    app = load_example().app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://orders") as http:
            yield http
    sys.modules.pop("fastapi_orders", None)


ORDER = {"order_id": "A-1", "lines": [{"sku": "lamp", "qty": 2, "price": 10.0}]}


async def state_of(http: httpx.AsyncClient, case_id: str) -> str:
    response = await http.get(f"/orders/{case_id}")
    assert response.status_code == 200
    state: str = response.json()["state"]
    return state


async def until(http: httpx.AsyncClient, case_id: str, state: str) -> None:
    with anyio.fail_after(10):
        while await state_of(http, case_id) != state:  # noqa: ASYNC110 - a client polls the API
            await anyio.sleep(0.01)


async def test_an_order_runs_from_start_to_shipped_through_the_api(store_env: None) -> None:
    """Start, status, data, a typed signal, the typed result and the trace all work through HTTP."""
    async with serving() as client:
        response = await client.post("/orders", json=ORDER)
        assert response.status_code == 201 and response.json() == {"case_id": "A-1"}
        await until(client, "A-1", "waiting_signal")
        status = (await client.get("/orders/A-1")).json()
        assert status["signals"] == ["approve"] and status["workflow"] == "order"
        assert (await client.get("/orders/A-1/data")).json()["total"] == 20.0
        response = await client.get("/orders/A-1/result")
        assert response.status_code == 409 and "still running" in response.json()["detail"]

        response = await client.post("/orders/A-1/signals/approve", json={"by": "ann"})
        assert response.status_code == 202
        await until(client, "A-1", "done")
        result = (await client.get("/orders/A-1/result")).json()
        assert result == {
            "order_id": "A-1", "total": 20.0, "payment": "P-A-1", "tracking": "TRK-A-1", "status": "shipped"
        }
        kinds = [event["kind"] for event in (await client.get("/orders/A-1/trace")).json()]
        assert kinds[0] == "case_started" and kinds[-1] == "case_done" and "signal_consumed" in kinds
        listed = (await client.get("/orders", params={"state": "done"})).json()
        assert [case["case_id"] for case in listed] == ["A-1"]


async def test_bad_requests_map_to_404_409_and_422_and_change_nothing(store_env: None) -> None:
    """Unknown ids 404, an id taken by another order or an unknown signal 409, bad bodies and a bad payload 422."""
    async with serving() as client:
        assert (await client.post("/orders", json=ORDER)).status_code == 201
        await until(client, "A-1", "waiting_signal")

        assert (await client.post("/orders", json=ORDER)).status_code == 201  # a retried start: the same order
        other = {**ORDER, "lines": [{"sku": "desk", "qty": 1, "price": 90.0}]}
        response = await client.post("/orders", json=other)
        assert response.status_code == 409 and "A-1" in response.json()["detail"]
        bad = {"order_id": "A-2", "lines": [{"sku": "lamp", "qty": 0, "price": 10.0}]}
        assert (await client.post("/orders", json=bad)).status_code == 422
        response = await client.get("/orders/nope")
        assert response.status_code == 404 and "GET /orders lists them" in response.json()["detail"]
        assert (await client.get("/orders/nope/data")).status_code == 404

        response = await client.post("/orders/A-1/signals/approve", json={"by": ""})
        assert response.status_code == 422
        assert response.json()["errors"][0]["loc"] == ["by"] and "Approval" in response.json()["detail"]
        response = await client.post("/orders/A-1/signals/aprove", json={"by": "ann"})
        assert response.status_code == 409 and "it waits for: approve" in response.json()["detail"]
        assert (await client.get("/orders", params={"limit": 0})).status_code == 422
        assert (await client.get("/orders", params={"state": "sleeping"})).status_code == 422

        status = (await client.get("/orders/A-1")).json()
        assert status["state"] == "waiting_signal" and status["signals"] == ["approve"]
        assert [e["kind"] for e in (await client.get("/orders/A-1/trace")).json()][-1] == "signal_waiting"


async def test_cancel_compensates_the_charge_and_a_second_cancel_is_a_conflict(store_env: None) -> None:
    """Cancelling a paid order refunds it (the saga's compensation) and ends it cancelled; once ended, 409."""
    async with serving() as client:
        assert (await client.post("/orders", json=ORDER)).status_code == 201
        await until(client, "A-1", "waiting_signal")
        response = await client.post("/orders/A-1/cancel", params={"reason": "changed my mind"})
        assert response.status_code == 202
        await until(client, "A-1", "cancelled")
        assert (await client.get("/orders/A-1/data")).json()["refunded"] == 20.0
        assert (await client.get("/orders/A-1")).json()["cancel_reason"] == "changed my mind"
        response = await client.post("/orders/A-1/cancel")
        assert response.status_code == 409 and "has ended (cancelled)" in response.json()["detail"]
        response = await client.post("/orders/A-1/signals/approve", json={"by": "ann"})
        assert response.status_code == 409 and "already ended" in response.json()["detail"]

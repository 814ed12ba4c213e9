"""An order flow: reserve stock and charge the card in parallel (with retries), then let the customer confirm.

    payment and stock run concurrently; the payment gateway fails once and is retried with backoff
    the customer has a short window to confirm or cancel; when it passes, the order is confirmed by default
    every step the cases take is printed as it happens, then each order's final data

Run it with `make demo` or `python examples/order_flow.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

import wfsub
from wfsub import Retry, defer, effect, par, seq, task

_gateway_calls: dict[str, int] = {}


def check_order(ctx: Mapping[str, Any]) -> dict[str, Any]:
    total = sum(line["qty"] * line["price"] for line in ctx["lines"])
    return {"total": round(total, 2), "status": "checked"}


async def reserve_stock(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.02)  # the warehouse API
    return {"reservation": f"R-{ctx['order_id']}"}


async def charge_card(ctx: Mapping[str, Any]) -> dict[str, Any]:
    calls = _gateway_calls[ctx["order_id"]] = _gateway_calls.get(ctx["order_id"], 0) + 1
    await anyio.sleep(0.01)
    if calls == 1:
        raise ConnectionError("payment gateway timed out")  # the first attempt fails; the retry succeeds
    return {"payment": f"P-{ctx['order_id']}", "charged": ctx["total"]}


async def refund(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.01)
    return {"refunded": ctx["charged"]}


async def ship(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.01)
    return {"tracking": f"TRK-{ctx['order_id']}"}


ORDER = seq(
    task(check_order),
    par(
        effect(reserve_stock, timeout=2.0),
        effect(charge_card, timeout=2.0, retry=Retry(max_attempts=3, initial=0.05, multiplier=2.0)),
    ),
    defer(
        {
            "confirmed": seq(task(lambda ctx: {"status": "confirmed"}, name="mark_confirmed"), effect(ship)),
            "cancelled": seq(effect(refund), task(lambda ctx: {"status": "cancelled"}, name="mark_cancelled")),
        },
        timeout=0.3,
        on_timeout=seq(task(lambda ctx: {"status": "confirmed by default"}, name="auto_confirm"), effect(ship)),
    ),
)


def show(event: wfsub.TraceEvent) -> None:
    print(event.format())


async def main() -> None:
    orders = {
        "A-100": [{"sku": "lamp", "qty": 1, "price": 49.0}],
        "A-101": [{"sku": "mug", "qty": 4, "price": 7.5}],
        "A-102": [{"sku": "desk", "qty": 1, "price": 320.0}],
    }
    async with wfsub.Substrate(trace_level="min", sinks=[wfsub.CallbackSink(show)]) as sub:
        handles = {
            order_id: await sub.new_case(ORDER, {"order_id": order_id, "lines": lines}, case_id=order_id)
            for order_id, lines in orders.items()
        }

        async def customer(order_id: str, answer: str, after: float) -> None:
            await anyio.sleep(after)
            await sub.signal(order_id, answer, {"via": "email"})

        async with anyio.create_task_group() as tg:
            tg.start_soon(customer, "A-100", "confirmed", 0.1)
            tg.start_soon(customer, "A-101", "cancelled", 0.15)
            # the customer never answers; the window closes and the order is confirmed by default

        results = {order_id: await handle.result(timeout=5) for order_id, handle in handles.items()}
        stats = sub.statistics()

    print()
    for order_id, data in results.items():
        print(f"{order_id}: {data['status']:<22} total={data['total']:<7} {', '.join(_extra(data))}")
    print(f"\n{stats.cases_done} orders done, {stats.trace_events} trace events, {stats.trace_dropped} dropped")


def _extra(data: Mapping[str, Any]) -> list[str]:
    keys = ("reservation", "payment", "charged", "refunded", "tracking")
    return [f"{k}={data[k]}" for k in keys if k in data]


if __name__ == "__main__":
    anyio.run(main)

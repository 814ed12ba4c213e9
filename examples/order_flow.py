"""An order flow that survives a crash: `make demo` (or `python examples/order_flow.py`).

Each order is a durable case on a SQLite store:

    check the order, then a saga: reserve stock (undo: release it), charge the card (retried; undo: refund),
    wait for the customer to confirm (or confirm by default when the window closes: 4 s for an express order,
    10 minutes for the others); then book the courier.

The demo runs the shop in a child process and kills it (SIGKILL) while a courier booking is in flight. A new
shop process opens the same store: the in-flight booking runs again with the same idempotency key, the express
order's confirmation window goes on where it was, and a cancel sent with the `wfsub` command compensates a paid
order (refund, then release the stock). The store stays in `.demo/orders.db` for `wfsub` to look at.

Every step waits on a state, never on the clock: the orders the demo signals or cancels have a window far longer
than the demo, and the first shop's courier never answers (it is killed mid-booking), so a slow machine shows
the same story.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

import wfsub
from wfsub import Retry, Substrate, defer, effect, effect_info, saga, seq, task, xor

STORE = Path(".demo") / "orders.db"
EXPRESS_WINDOW = 4.0  # seconds an express order's customer has to confirm before it is confirmed by default
CONFIRM_WINDOW = 600.0  # the same for the other orders
COURIER_SECONDS = 1.0  # how long a booking takes; the first shop's courier never answers (it is killed first)


def check_order(ctx: Mapping[str, Any]) -> dict[str, Any]:
    total = sum(line["qty"] * line["price"] for line in ctx["lines"])
    return {"total": round(total, 2)}


async def reserve_stock(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.02)  # the warehouse API
    return {"reservation": f"R-{ctx['order_id']}"}


async def release_stock(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.02)
    return {"released": ctx["reservation"]}


async def charge_card(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.02)
    if effect_info().attempt == 1:
        raise ConnectionError("payment gateway timed out")  # the first attempt fails; the retry succeeds
    return {"payment": f"P-{ctx['order_id']}", "charged": ctx["total"]}


async def refund(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.02)
    return {"refunded": ctx["charged"]}


async def book_courier(ctx: Mapping[str, Any]) -> dict[str, Any]:
    key = effect_info().idempotency_key  # the courier dedupes on it: a booking re-run after a crash is one booking
    print(f"    courier: booking a shipment for {ctx['order_id']} (idempotency key {key})", flush=True)
    await anyio.sleep(COURIER_SECONDS)
    return {"tracking": f"TRK-{ctx['order_id']}"}


def confirmation(window: float) -> wfsub.Term:
    """The customer confirms within `window` seconds, or the order is confirmed by default."""
    return defer(
        {"confirmed": task(lambda ctx: {"status": "confirmed"}, name="confirm")},
        timeout=window,
        on_timeout=task(lambda ctx: {"status": "confirmed by default"}, name="confirm_by_default"),
    )


ORDER = seq(
    task(check_order),
    saga(
        (effect(reserve_stock), effect(release_stock)),
        (effect(charge_card, retry=Retry(max_attempts=3, initial=0.05)), effect(refund)),
        xor((lambda ctx: ctx.get("express", False), confirmation(EXPRESS_WINDOW)),
            default=confirmation(CONFIRM_WINDOW)),
    ),
    effect(book_courier, timeout=10.0),
)

ORDERS = {
    "A-100": {"lines": [{"sku": "lamp", "qty": 1, "price": 49.0}]},
    "A-101": {"lines": [{"sku": "mug", "qty": 4, "price": 7.5}]},
    "A-102": {"lines": [{"sku": "desk", "qty": 1, "price": 320.0}], "express": True},
}
SHOWN = {"case_started", "task", "effect_requested", "effect_completed", "effect_retry", "signal_consumed",
         "deferred_choice", "timer_fired", "case_done", "case_cancelled", "case_failed"}


def show(event: wfsub.TraceEvent) -> None:
    if event.kind in SHOWN:
        print(f"    {event.case_id}  {event.kind:<17} {event.path:<26} {_detail(event.detail)}", flush=True)


def _detail(detail: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in detail.items() if k in ("name", "signal", "chosen", "attempt", "reason"))


def shop(*sinks: wfsub.TraceSink) -> Substrate:
    return Substrate(
        store=STORE, workflows={"order": ORDER}, trace_level="min", sinks=[wfsub.CallbackSink(show), *sinks]
    )


# -- the first shop process: takes the orders, then dies ---------------------------------------------------------


async def first_shop() -> None:
    global COURIER_SECONDS
    COURIER_SECONDS = 3600.0  # this shop is killed while its courier booking is in flight
    waiting: set[str] = set()
    all_waiting = anyio.Event()

    def watch(event: wfsub.TraceEvent) -> None:
        if event.kind == "signal_waiting":
            waiting.add(event.case_id)
            if waiting == set(ORDERS):
                all_waiting.set()

    async with shop(wfsub.CallbackSink(watch)) as sub:
        for order_id, order in ORDERS.items():
            await sub.new_case("order", {"order_id": order_id, **order}, case_id=order_id)
        await all_waiting.wait()
        print("ready", flush=True)
        await anyio.sleep_forever()


# -- the second shop process (this one): recovers the orders and sees them through -------------------------------


async def second_shop() -> dict[str, str]:
    async with shop() as sub:
        print("   The customer of A-101 cancels; the paid order is compensated (refund, then release the stock).")
        await anyio.to_thread.run_sync(lambda: wfsub_command("cancel", "A-101", "--reason", "customer cancelled"))
        print("   Nobody answers for express order A-102: its window, opened before the crash, closes on time.")
        results: dict[str, str] = {}
        for order_id in ORDERS:
            try:
                data = await sub.await_case(order_id)
                results[order_id] = f"{data['status']}, charged {data['charged']}, tracking {data['tracking']}"
            except wfsub.CaseCancelled as exc:
                data = sub.data(order_id)
                refunded, released = data["refunded"], data["released"]
                results[order_id] = f"cancelled ({exc.reason}): refunded {refunded}, released {released}"
    return results


def wfsub_command(*args: str) -> None:
    """Run the `wfsub` command on the demo store and show it as a user would type it."""
    print(f"\n$ wfsub {args[0]} {STORE} {shlex.join(args[1:])}".rstrip(), flush=True)
    subprocess.run([sys.executable, "-m", "wfsub", args[0], str(STORE), *args[1:]], check=True,
                   env={**os.environ, "COLUMNS": "110"})


def demo() -> None:
    STORE.parent.mkdir(exist_ok=True)
    for leftover in STORE.parent.glob(STORE.name + "*"):
        leftover.unlink()

    print(f"1. The shop (a child process) takes three orders; they wait for their customers to confirm "
          f"(express orders: {EXPRESS_WINDOW:g}s).")
    child = subprocess.Popen([sys.executable, __file__, "--first-shop"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    for line in child.stdout:
        if line.strip() == "ready":
            break
        print(line, end="")
    wfsub_command("signal", "A-100", "confirmed", '{"via": "app"}')
    for line in child.stdout:
        print(line, end="")
        if "courier: booking a shipment for A-100" in line:
            break
    print(f"\n2. kill -9 {child.pid}: the shop dies while the courier booking of A-100 is in flight.")
    child.send_signal(signal.SIGKILL)
    child.wait()
    wfsub_command("cases")

    print("\n3. A new shop process opens the store: A-100's booking runs again, with the same key.")
    results = anyio.run(second_shop)
    print("\n4. Outcomes:")
    for order_id, outcome in results.items():
        print(f"   {order_id}: {outcome}")
    wfsub_command("cases")
    print(f"\nThe store stays in {STORE}: try `wfsub show {STORE} A-101` or `wfsub journal {STORE} A-100`.")


if __name__ == "__main__":
    if sys.argv[1:] == ["--first-shop"]:
        anyio.run(first_shop)
    else:
        demo()

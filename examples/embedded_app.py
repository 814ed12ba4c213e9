"""wfsub inside an application: one long-lived Substrate serves cases that other coroutines start and signal.

A small support desk. `SupportDesk` owns the Substrate for the life of the app; request handlers (here,
simulated customers and agents running concurrently) open tickets and send replies through it, a monitor
coroutine reads statistics while the app runs, and the app shuts down cleanly at the end.

Each ticket is a case:
    classify it (an effect), page the on-call engineer when it is urgent (exclusive choice),
    then loop: wait for the customer or the agent (deferred choice), and close the ticket by itself when
    nobody writes for a while (the deferred choice's timeout); finally send a survey (an effect).

Run it with `python examples/embedded_app.py`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import anyio

import wfsub
from wfsub import defer, effect, loop, seq, task, xor


async def classify(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.01)  # a call to a classifier service
    return {"priority": "urgent" if "down" in ctx["text"] else "normal", "state": "open", "messages": [ctx["text"]]}


async def page_oncall(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.01)
    return {"paged": True}


async def send_survey(ctx: Mapping[str, Any]) -> dict[str, Any]:
    await anyio.sleep(0.01)
    return {"survey_sent": True}


def add_message(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"messages": [*ctx["messages"], ctx["customer_reply"]]}


TICKET = seq(
    effect(classify, retry=wfsub.Retry(max_attempts=3, initial=0.05)),
    xor((lambda ctx: ctx["priority"] == "urgent", effect(page_oncall)), default=task(lambda ctx: None, name="queue")),
    loop(
        defer(
            {
                "customer_reply": task(add_message),
                "agent_resolved": task(lambda ctx: {"state": "resolved"}, name="resolve"),
            },
            timeout=0.5,
            on_timeout=task(lambda ctx: {"state": "auto_closed"}, name="auto_close"),
        ),
        until=lambda ctx: ctx["state"] in ("resolved", "auto_closed"),
        max_iterations=50,
    ),
    effect(send_survey),
)


class SupportDesk:
    """The application's service object: it owns the Substrate for as long as the app runs."""

    def __init__(self, sub: wfsub.Substrate) -> None:
        self._sub = sub
        self._next = 0

    async def open_ticket(self, customer: str, text: str) -> str:
        self._next += 1
        ticket_id = f"T-{self._next:03d}"
        await self._sub.new_case(TICKET, {"customer": customer, "text": text}, case_id=ticket_id)
        return ticket_id

    async def customer_reply(self, ticket_id: str, text: str) -> None:
        await self._sub.signal(ticket_id, "customer_reply", text)

    async def resolve(self, ticket_id: str) -> None:
        await self._sub.signal(ticket_id, "agent_resolved")

    async def outcome(self, ticket_id: str) -> dict[str, Any]:
        return await self._sub.await_case(ticket_id, timeout=10)

    def state(self, ticket_id: str) -> str:
        return self._sub.status(ticket_id).state.value


async def customer_session(desk: SupportDesk, name: str, rng: random.Random, opened: list[str]) -> None:
    text = rng.choice(["checkout is down", "invoice has a typo", "how do I export data?", "login page down"])
    ticket = await desk.open_ticket(name, text)
    opened.append(ticket)
    for _ in range(rng.randint(0, 2)):
        await anyio.sleep(rng.uniform(0.02, 0.1))
        await desk.customer_reply(ticket, f"{name}: any news?")


async def agent(desk: SupportDesk, opened: list[str]) -> None:
    """Works through the queue once; the tickets it does not get to close themselves after a quiet spell."""
    await anyio.sleep(0.3)
    for ticket in sorted(opened)[::2]:
        if desk.state(ticket) == "waiting_signal":
            await desk.resolve(ticket)


async def monitor(sub: wfsub.Substrate, stop: anyio.Event) -> None:
    while not stop.is_set():
        stats = sub.statistics()
        print(f"[monitor] live={stats.cases_live} done={stats.cases_done} failed={stats.cases_failed}")
        with anyio.move_on_after(0.2):
            await stop.wait()


async def main() -> None:
    rng = random.Random(7)
    opened: list[str] = []
    async with wfsub.Substrate(trace_level="none") as sub:  # lives as long as the app
        desk = SupportDesk(sub)
        stop = anyio.Event()
        async with anyio.create_task_group() as app:
            app.start_soon(monitor, sub, stop)
            async with anyio.create_task_group() as traffic:
                for i in range(8):
                    traffic.start_soon(customer_session, desk, f"customer{i}", rng, opened)
                traffic.start_soon(agent, desk, opened)
            outcomes = {ticket: await desk.outcome(ticket) for ticket in sorted(opened)}
            stop.set()

    print()
    for ticket, data in outcomes.items():
        print(
            f"{ticket} {data['customer']:<10} {data['priority']:<7} {data['state']:<12} "
            f"paged={data.get('paged', False)!s:<5} messages={len(data['messages'])}"
        )


if __name__ == "__main__":
    anyio.run(main)

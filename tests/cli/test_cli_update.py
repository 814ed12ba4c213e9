"""`wfsub update STORE CASE NAME [JSON]`, run as a subprocess against a SQLite store whose owner runs in the test:
it prints the answer as JSON; a refusal (an unknown update name, a check= that says no) exits 1 with the message;
a repeated request id prints the first answer again."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from wfsub import Substrate, reply, seq, task, wait

from .test_cli import wfsub

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def positive(ctx: Mapping[str, Any], payload: Any) -> str | None:
    return None if isinstance(payload, int) and payload > 0 else "the amount must be a positive int"


def add(ctx: Mapping[str, Any]) -> dict[str, Any]:
    return {"n": ctx["n"] + ctx["add"]}


WORKFLOWS = {
    "counter": seq(wait("add", check=positive), task(add), reply("add", lambda ctx: {"n": ctx["n"]}), wait("end")),
}


async def test_update_prints_the_answer_and_reports_refusals(tmp_path: Path) -> None:
    """The command prints the owner's answer; an unknown name or a refused payload exits 1 with the reason;
    a repeated request id prints the first answer and applies once."""
    async with Substrate(store=tmp_path / "cases.db", workflows=WORKFLOWS) as sub:
        await sub.new_case("counter", {"n": 1}, case_id="c1")
        ran = await wfsub(tmp_path, "update", "cases.db", "c1", "ad", "3")
        assert ran.code == 1 and "answers no update of that name" in ran.err
        ran = await wfsub(tmp_path, "update", "cases.db", "c1", "add", "--", "-3")
        assert ran.code == 1 and "the amount must be a positive int" in ran.err
        ran = await wfsub(tmp_path, "update", "cases.db", "c1", "add", "3", "--request-id", "r1")
        assert ran.code == 0, ran.err
        assert json.loads(ran.out) == {"n": 4}
        ran = await wfsub(tmp_path, "update", "cases.db", "c1", "add", "3", "--request-id", "r1")
        assert ran.code == 0 and json.loads(ran.out) == {"n": 4}
        assert [r.kind for r in await sub.journal("c1")].count("signal") == 1


class Amount(BaseModel):
    n: int


MODELLED = {"adder": seq(wait("add", model=Amount, reply=lambda ctx: {"got": ctx["add"]["n"]}), wait("end"))}


async def test_an_update_whose_payload_its_model_refuses_is_refused_as_an_update(tmp_path: Path) -> None:
    """A payload that does not fit the update's model is refused by the command as an update, naming the model."""
    async with Substrate(store=tmp_path / "cases.db", workflows=MODELLED) as sub:
        await sub.new_case("adder", case_id="c1")
        ran = await wfsub(tmp_path, "update", "cases.db", "c1", "add", '{"n": "many"}')
        assert ran.code == 1
        assert "cannot take update 'add' at seq[0].wait" in ran.err and "Amount" in ran.err, ran.err
        assert "take signal" not in ran.err
        assert sub.status("c1").signals == ("add",)  # nothing was applied


async def test_a_repeated_update_to_a_passed_wait_exits_1_naming_where_the_case_is(tmp_path: Path) -> None:
    """An update sent with a new request id after the case passed its only wait for it is refused by the owner at
    once: the command exits 1 naming the wait passed and where the case waits now; the first request id still
    prints the first answer."""
    async with Substrate(store=tmp_path / "cases.db", workflows=WORKFLOWS) as sub:
        await sub.new_case("counter", {"n": 1}, case_id="c1")
        ran = await wfsub(tmp_path, "update", "cases.db", "c1", "add", "3", "--request-id", "r1")
        assert ran.code == 0 and json.loads(ran.out) == {"n": 4}, ran.err
        ran = await wfsub(tmp_path, "update", "cases.db", "c1", "add", "3", "--request-id", "r2", "--timeout", "60")
        assert ran.code == 1, (ran.out, ran.err)
        assert "passed every wait for it (seq[0].wait)" in ran.err and "seq[3].wait" in ran.err, ran.err
        assert [r.request_id for r in sub.status("c1").refused] == ["r2"]
        ran = await wfsub(tmp_path, "update", "cases.db", "c1", "add", "3", "--request-id", "r1")
        assert ran.code == 0 and json.loads(ran.out) == {"n": 4}

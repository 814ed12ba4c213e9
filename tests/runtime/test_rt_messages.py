"""What the API tells a person: start data checked against a workflow's input model, an effect that returned
data its case cannot keep, a case that a region's cancel ended."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import pydantic
import pytest

import wfsub
from wfsub import (
    CaseCancelled,
    CaseFailed,
    EffectResultError,
    InvalidStartData,
    Retry,
    Substrate,
    Workflow,
    effect,
    scope,
    seq,
    task,
    wait,
)
from wfsub.lowlevel import Workflows
from wfsub.stores import MemoryStore


class LoanApplication(pydantic.BaseModel):
    applicant: str
    amount: int = pydantic.Field(gt=0)
    currency: str = "EUR"


LOAN = seq(task(lambda c: {"approved": c["amount"] < 1000}, name="score"))


async def test_a_start_that_does_not_fit_the_input_model_is_refused_and_nothing_is_stored() -> None:
    """new_case refuses data its workflow's input model rejects: InvalidStartData with pydantic's errors, no case."""
    store = MemoryStore()
    async with Substrate(store=store, workflows={"loan": Workflow(LOAN, input=LoanApplication)}) as sub:
        with pytest.raises(InvalidStartData) as info:
            await sub.new_case("loan", {"amount": -5}, case_id="L-1")
        text = str(info.value)
        assert "cannot start case 'L-1' of workflow 'loan'" in text and "does not fit LoanApplication" in text
        assert "applicant: Field required" in text and "amount: Input should be greater than 0" in text
        assert {tuple(e["loc"]) for e in info.value.errors} == {("applicant",), ("amount",)}
        assert isinstance(info.value, ValueError) and info.value.workflow == "loan"
        with pytest.raises(InvalidStartData, match="applicant: Field required"):
            await sub.new_case("loan")  # no data at all is checked too
        assert sub.cases() == [] and await store.row("L-1") is None
        handle = await sub.new_case("loan", {"applicant": "ana", "amount": "500"}, case_id="L-2")
        assert await handle.result() == {"applicant": "ana", "amount": 500, "currency": "EUR", "approved": True}


async def test_versions_mix_workflow_and_bare_terms_and_the_newest_input_model_checks_new_cases() -> None:
    """A versions list may mix Workflow and bare terms; the newest version's model checks new cases, and its
    JSON Schema is kept on the registry by name."""
    older = seq(task(lambda c: {"v": 1}))
    flows = {"loan": [older, Workflow(LOAN, input=LoanApplication)], "free": older}
    async with Substrate(workflows=flows) as sub:
        with pytest.raises(InvalidStartData):
            await sub.new_case("loan", {"applicant": "bo"})
        assert await (await sub.new_case("free", {"anything": [1]})).result() == {"anything": [1], "v": 1}
    registry = Workflows(flows, None)
    assert registry.input_schemas["loan"] == LoanApplication.model_json_schema()
    assert "free" not in registry.input_schemas


def test_workflow_refuses_what_is_not_a_term_or_not_a_model() -> None:
    """Workflow(term, input=) says what it takes when given something else."""
    with pytest.raises(TypeError, match="takes a workflow term"):
        Workflow("loan", input=LoanApplication)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a pydantic model class"):
        Workflow(LOAN, input=dict)  # type: ignore[arg-type]
    assert "Workflow" in wfsub.__all__ and wfsub.Workflow is Workflow


async def dated(ctx: Mapping[str, Any]) -> dict[str, Any]:
    dated.calls += 1  # type: ignore[attr-defined]
    return {"when": datetime.datetime(2026, 1, 1)}


async def test_an_effect_that_returns_data_that_is_not_json_is_said_to_return_it_and_is_not_retried() -> None:
    """The failure says the effect returned data that is not JSON, with its path and the fix; no retry runs."""
    dated.calls = 0  # type: ignore[attr-defined]
    flows = {"f": seq(effect(dated, name="fetch", retry=Retry(max_attempts=3, initial=0.01)))}
    async with Substrate(store=MemoryStore(), workflows=flows) as sub:
        with pytest.raises(CaseFailed) as info:
            await (await sub.new_case("f", {})).result()
    text = str(info.value)
    assert "effect 'fetch' at seq[0].effect returned data that is not JSON" in text
    assert 'result["when"]: datetime is not JSON; pass .isoformat()' in text and "not retried" in text
    assert "raised" not in text and isinstance(info.value.__cause__, EffectResultError)
    assert dated.calls == 1  # type: ignore[attr-defined]


async def test_a_region_cancel_that_takes_the_last_thread_says_so() -> None:
    """cancel_region on a region holding the case's only thread ends it with a reason naming that region."""
    flow = seq(scope("decision", wait("decision")), task(lambda c: {"after": True}))
    async with Substrate() as sub:
        handle = await sub.new_case(flow, {})
        await sub.cancel_region(handle.case_id, "decision")
        with pytest.raises(CaseCancelled) as info:
            await handle.result()
    text = str(info.value)
    assert "cancel_region('decision') ended it" in text and "at seq[0].scope" in text
    assert "on_cancel=" in text and "root thread" not in text


async def test_an_input_for_a_suspended_case_says_it_waits_for_a_version_and_why() -> None:
    """A signal to a suspended case is refused saying no registered version can run it, the reason and the fix."""
    store = MemoryStore()
    async with Substrate(store=store, workflows={"loan": seq(wait("decision"))}) as sub:
        await sub.new_case("loan", {}, case_id="L-1")
    async with Substrate(store=store, workflows={"other": seq(wait("x"))}) as sub:
        with pytest.raises(wfsub.SignalRejected) as info:
            await sub.signal("L-1", "decision", 1)
    text = str(info.value)
    assert "cannot take signal 'decision': it is suspended: no registered version of its workflow" in text
    assert "'loan'" in text and "register the version it started on" in text and "or cancel it" in text

"""The program summary's payload check (a model's JSON Schema, for processes without the model) refuses what
the model refuses and takes what it takes, pydantic's lax coercions included, with pydantic's wording."""

from __future__ import annotations

from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from wfsub._runtime._summary import payload_errors


class Item(BaseModel):
    sku: str = Field(min_length=1)
    qty: int = Field(gt=0)


class Order(BaseModel):
    by: str
    rush: bool = False
    lines: list[Item] = []
    kind: Literal["a", "b"] = "a"
    note: str | None = None
    limit: float = Field(default=1.0, le=10)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ok: bool


CASES: list[tuple[type[BaseModel], Any]] = [
    (Order, {"by": "ann"}),
    (Order, {"by": 3}),
    (Order, {}),
    (Order, None),
    (Order, "ann"),
    (Order, {"by": "ann", "rush": "yes"}),
    (Order, {"by": "ann", "rush": "maybe"}),
    (Order, {"by": "ann", "lines": [{"sku": "x", "qty": "2"}]}),
    (Order, {"by": "ann", "lines": [{"sku": "", "qty": 0}]}),
    (Order, {"by": "ann", "lines": {"sku": "x"}}),
    (Order, {"by": "ann", "kind": "c"}),
    (Order, {"by": "ann", "note": None}),
    (Order, {"by": "ann", "note": 5}),
    (Order, {"by": "ann", "limit": "11"}),
    (Order, {"by": "ann", "limit": 2.5, "extra": 1}),
    (Strict, {"ok": True, "extra": 1}),
    (Strict, {"ok": 1}),
]


@pytest.mark.parametrize(("model", "payload"), CASES)
def test_the_schema_check_refuses_exactly_what_the_model_refuses(model: type[BaseModel], payload: Any) -> None:
    """payload_errors(schema) is empty exactly when model_validate takes the payload; the messages are pydantic's."""
    try:
        model.model_validate(payload)
        wanted: list[tuple[tuple[Any, ...], str]] = []
    except ValidationError as exc:
        wanted = [(tuple(e["loc"]), e["msg"]) for e in exc.errors()]
    got = [(tuple(e["loc"]), e["msg"]) for e in payload_errors(model.model_json_schema(), payload)]
    assert bool(got) == bool(wanted), (got, wanted)
    assert {msg.split(",")[0] for _, msg in got} <= {msg.split(",")[0] for _, msg in wanted} | {
        "Input does not match any of the types allowed"
    }, (got, wanted)

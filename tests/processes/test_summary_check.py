"""The program summary's payload check (a model's JSON Schema, for processes without the model) refuses what
the model refuses and takes what it takes, pydantic's lax coercions included, with pydantic's wording; a field
is taken by every name the model takes it by, and where a validator decides, the check lets the input through."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import anyio
import pytest
from pydantic import (
    AliasChoices,
    AliasPath,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.dataclasses import dataclass
from typing_extensions import TypedDict

from wfsub import Client, InvalidStartData, SignalRejected, Substrate, Workflow, seq, wait
from wfsub._compiler import compile_workflow
from wfsub._runtime._inputs import against_summary
from wfsub._runtime._mailbox import Signal
from wfsub._runtime._summary import model_schema, payload_errors, summary_of


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


class Named(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    user: str = Field(alias="userName")
    level: int = Field(default=1, validation_alias=AliasChoices("lvl", "Level"))


class Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)
    first_name: str
    named: Named | None = None


class ByAlias(BaseModel):
    code: str = Field(alias="Code")  # no populate_by_name: only the alias is taken


class Pair(TypedDict):
    __pydantic_config__ = ConfigDict(populate_by_name=True)  # type: ignore[misc]
    left: Annotated[int, Field(alias="L")]


@dataclass(config=ConfigDict(populate_by_name=True))
class Point:
    x: int = Field(alias="X")


class Holder(BaseModel):
    pair: Pair | None = None
    point: Point | None = None


NAMED_CASES: list[tuple[type[BaseModel], Any]] = [
    (Named, {"user": "ann"}),
    (Named, {"userName": "ann"}),
    (Named, {}),
    (Named, {"user": 3}),
    (Named, {"user": "ann", "lvl": 2}),
    (Named, {"user": "ann", "Level": "2"}),
    (Named, {"user": "ann", "level": 2}),
    (Named, {"user": "ann", "lvl": "x"}),
    (Named, {"user": "ann", "other": 1}),
    (Named, {"user": "ann", "userName": "bob"}),
    (Camel, {"first_name": "ann"}),
    (Camel, {"firstName": "ann", "named": {"user": "bob"}}),
    (Camel, {"firstName": "ann", "named": {"userName": 5}}),
    (Camel, {}),
    (ByAlias, {"Code": "x"}),
    (ByAlias, {"code": "x"}),
    (Holder, {"pair": {"left": 1}, "point": {"x": 2}}),
    (Holder, {"pair": {"L": 1}, "point": {"X": 2}}),
    (Holder, {"pair": {"left": "a"}}),
]


@pytest.mark.parametrize(("model", "payload"), NAMED_CASES)
def test_the_summary_check_takes_a_field_by_every_name_the_model_takes_it_by(
    model: type[BaseModel], payload: Any
) -> None:
    """Against the summary's schema (`model_schema`), payload_errors is empty exactly when model_validate takes the
    payload, for fields taken by alias, by name (populate_by_name), by AliasChoices, in TypedDicts and dataclasses."""
    try:
        model.model_validate(payload)
        wanted: list[tuple[tuple[Any, ...], str]] = []
    except ValidationError as exc:
        wanted = [(tuple(e["loc"]), e["msg"]) for e in exc.errors()]
    schema = model_schema(model)
    assert schema is not None
    got = [(tuple(e["loc"]), e["msg"]) for e in payload_errors(schema, payload)]
    assert bool(got) == bool(wanted), (got, wanted)
    assert {loc for loc, _ in got} <= {loc for loc, _ in wanted} | {loc[:1] for loc, _ in wanted}, (got, wanted)


class Deep(BaseModel):
    first: int = Field(validation_alias=AliasChoices(AliasPath("names", 0), "first"))


class Lenient(BaseModel):
    n: int
    when: Annotated[int, BeforeValidator(lambda v: len(v) if isinstance(v, str) else v)] = 0
    wrapped: Annotated[int, WrapValidator(lambda v, handler: handler(0 if v == "none" else v))] = 0
    plain: Annotated[int, PlainValidator(lambda v: int(str(v).strip("#")))] = 0

    @field_validator("n", mode="before")
    @classmethod
    def counted(cls, value: Any) -> Any:
        return len(value) if isinstance(value, list) else value


class Shaped(BaseModel):
    total: int

    @model_validator(mode="before")
    @classmethod
    def from_text(cls, value: Any) -> Any:
        return {"total": int(value)} if isinstance(value, str) else value


TAKEN: list[tuple[type[BaseModel], Any]] = [
    (Deep, {"names": [3]}),
    (Deep, {"first": 3}),
    (Lenient, {"n": [1, 2], "when": "abc", "wrapped": "none", "plain": "#4"}),
    (Shaped, "12"),
    (Shaped, {"total": 3}),
]


@pytest.mark.parametrize(("model", "payload"), TAKEN)
def test_the_summary_check_lets_through_what_a_validator_or_an_alias_path_decides(
    model: type[BaseModel], payload: Any
) -> None:
    """What a before, wrap or plain validator (a field's, an Annotated one, a model's) or an AliasPath lets the model
    take, the summary's check lets through: it cannot tell, and never refuses what the owner would take."""
    model.model_validate(payload)
    schema = model_schema(model)
    assert schema is not None
    assert payload_errors(schema, payload) == []


def test_a_summary_check_still_refuses_around_what_a_validator_decides() -> None:
    """A field no validator decides is still checked next to one that is: a missing n and a str for an int."""
    schema = model_schema(Lenient)
    assert schema is not None
    assert [(e["loc"], e["msg"]) for e in payload_errors(schema, {"when": "x"})] == [(("n",), "Field required")]
    schema = model_schema(Named)
    assert schema is not None
    wrong = payload_errors(schema, {"user": "ann", "lvl": "x"})
    assert [(e["loc"], e["msg"]) for e in wrong] == [(("lvl",), "Input should be a valid integer")]


def test_a_summary_of_format_1_lets_a_field_given_by_another_name_through() -> None:
    """A summary written before it listed other names (no `format`) lets {"user": ...} through for a field aliased
    userName (it cannot tell), and still refuses a wrong type under the property's own name."""
    summary = {"root": "seq", "signals": {"who": Named.model_json_schema()}, "waits": {"who": ["seq[0]"]}}
    against_summary(Signal("who", {"user": "ann", "x": 1}), summary, "a")
    with pytest.raises(SignalRejected, match="Input should be a valid string"):
        against_summary(Signal("who", {"userName": 5}), summary, "a")
    assert summary_of("w", compile_workflow(seq(wait("who", model=Named)))).summary["format"] >= 2


NAMED_FLOW = {"n": Workflow(seq(wait("who", model=Named)), input=Camel)}


async def test_a_client_with_no_owner_checks_aliased_fields_as_the_owner_does(tmp_path: Path) -> None:
    """With no owner running, a Client takes a start and a signal that give fields by name or by alias, refuses
    one missing a required field (by its alias, as pydantic says) or giving an unknown key; the next owner
    applies what was taken and refuses nothing."""
    path = str(tmp_path / "c.db")
    async with Substrate(store=path, workflows=NAMED_FLOW):
        pass
    async with Client(path) as client:
        await client.new_case("n", {"first_name": "ann"}, case_id="a")
        with pytest.raises(InvalidStartData, match="firstName"):
            await client.new_case("n", {}, case_id="b")
        await client.signal("a", "who", {"user": "bob", "Level": 3})
        with pytest.raises(SignalRejected, match="userName"):
            await client.signal("a", "who", {"lvl": 2})
        with pytest.raises(SignalRejected, match="Extra inputs are not permitted"):
            await client.signal("a", "who", {"user": "bob", "nickname": "b"})
    async with Substrate(store=path, workflows=NAMED_FLOW) as sub:
        with anyio.fail_after(60):
            data = await sub.await_case("a")
        assert sub.status("a").refused == ()
    assert data["who"] == {"user": "bob", "level": 3}

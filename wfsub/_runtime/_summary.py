"""Program summaries: what a registered program version can take, written to its store once per fingerprint,
so that a process without the program (the `wfsub` command, a `wfsub.Client`, a standby Substrate) can check an
input as the case's owner would before writing it to the inbox.

A summary is JSON:

    {"workflow": name, "root": the workflow's root node path,
     "signals": {name: the JSON Schema of its payload model, or None},
     "updates": {name: the JSON Schema of its payload model, or None},   (the names an update can be sent to)
     "regions": {name: "scope" | "mi"},
     "compensations": {name: [node paths]}}          (each saga compensation's name -> where it starts)

`compensations` lets `wfsub show` say where each compensation a case's end names ran (the end records names).

`payload_errors(schema, payload)` checks a payload against the JSON Schema of its model (the subset pydantic
writes: types, properties and required, items, enums and consts, anyOf, $ref into $defs, bounds on numbers and
lengths, extra properties forbidden). It refuses only what the model would refuse: where pydantic's lax mode takes
a value (the str "3" for an int, 1 for a bool, a number for a datetime or a
timedelta, "1" for an IntEnum), so does it; the owner checks the payload again with the model
itself. Errors come as pydantic gives them (`loc`, `msg`), so the refusal reads as the owner's. The check itself
(the refusal and its message) is in `wfsub._runtime._inputs`, the one module that checks inputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from .._program import Program, signal_waits
from .._store import ProgramSummary


def summary_of(name: str, program: Program, input_model: type | None = None) -> ProgramSummary:
    """The summary of a registered program version (`input_model`: the model its start data must fit, from
    `Workflow(term, input=Model)`: its JSON Schema is kept, so a client refuses a bad start as the owner would)."""
    signals: dict[str, Any] = {}
    for signal in sorted(program.signals):
        model = program.signal_models.get(signal)
        schema = getattr(model, "model_json_schema", None)
        signals[signal] = schema() if callable(schema) else None
    summary = {
        "workflow": name,
        "input": _schema_of(input_model),
        "root": program.root_path,
        "signals": signals,
        "waits": signal_waits(program),  # each signal -> the node paths of the waits that take it (for refusals)
        "updates": {name: signals.get(name) for name in sorted(program.updates)},
        "regions": dict(sorted(program.regions.items())),
        "compensations": compensations_of(program),
    }
    return ProgramSummary(program.fingerprint, name, summary)


_HANDLER_START = re.compile(r"\[\d+\.compensation\]\.\w+")


def compensations_of(program: Program) -> dict[str, list[str]]:
    """Each saga compensation of a program -> the node paths where it starts, by the name a case's end records
    for it (the task's or effect's name, a scope's name, else its path, as the compiler names it)."""
    labels: dict[str, str] = {}
    for path, label in zip(program.paths, program.labels, strict=True):
        labels.setdefault(path, label)
    scopes = {path: name for name, paths in program.region_paths.items() for path in paths}
    found: dict[str, list[str]] = {}
    for path in labels:
        for match in _HANDLER_START.finditer(path):
            start = path[: match.end()]
            name = labels.get(start) or scopes.get(start) or start
            if start not in found.get(name, ()):
                found.setdefault(name, []).append(start)
    return found


def _schema_of(model: type | None) -> dict[str, Any] | None:
    schema = getattr(model, "model_json_schema", None)
    return schema() if callable(schema) else None


def model_name(schema: Mapping[str, Any]) -> str:
    """The name of the model a schema was made from (its title), for messages."""
    title = schema.get("title")
    return title if isinstance(title, str) and title else "its model"


_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_TYPE_MESSAGES = {
    "integer": "Input should be a valid integer",
    "number": "Input should be a valid number",
    "string": "Input should be a valid string",
    "boolean": "Input should be a valid boolean",
    "array": "Input should be a valid list",
    "null": "Input should be None",
}


def payload_errors(schema: Mapping[str, Any], payload: Any) -> list[dict[str, Any]]:
    """What a payload breaks of its model's JSON Schema, as pydantic's errors (`loc`, `msg`); [] if nothing."""
    errors: list[dict[str, Any]] = []
    defs = schema.get("$defs", {})
    _check(schema, payload, (), errors, defs if isinstance(defs, Mapping) else {})
    return errors


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    seen = 0
    while isinstance(ref, str) and ref.startswith("#/$defs/") and seen < 32:
        target = defs.get(ref[len("#/$defs/"):])
        if not isinstance(target, Mapping):
            return {}
        schema, ref, seen = target, target.get("$ref"), seen + 1
    return schema


def _number(value: Any) -> float | None:
    """The number pydantic's lax mode reads `value` as (None: not a number)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "integer":
        number = _number(value)
        return number is not None and number == int(number)
    if kind == "number":
        return _number(value) is not None
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        if isinstance(value, bool) or value in (0, 1):
            return True
        return isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE
    if kind == "array":
        return isinstance(value, list | tuple)
    if kind == "object":
        return isinstance(value, Mapping)
    if kind == "null":
        return value is None
    return True  # a type this check does not know: the owner decides


def _check(
    schema: Mapping[str, Any], value: Any, loc: tuple[Any, ...], errors: list[dict[str, Any]],
    defs: Mapping[str, Any],
) -> None:
    schema = _resolve(schema, defs)
    if not schema:
        return
    options = schema.get("anyOf")
    if isinstance(options, list) and options:
        for option in options:
            if isinstance(option, Mapping):
                trial: list[dict[str, Any]] = []
                _check(option, value, loc, trial, defs)
                if not trial:
                    return
        errors.append({"loc": loc, "msg": "Input does not match any of the types allowed"})
        return
    if "const" in schema and value != schema["const"]:
        errors.append({"loc": loc, "msg": f"Input should be {schema['const']!r}"})
        return
    choices = schema.get("enum")
    if isinstance(choices, list) and value not in choices and not _numeric_choice(choices, value):
        shown = " or ".join(repr(choice) for choice in choices)
        errors.append({"loc": loc, "msg": f"Input should be {shown}"})
        return
    kind = schema.get("type")
    if kind == "string" and schema.get("format") in _TIMES and isinstance(value, int | float):
        return  # lax mode reads a number as a time (epoch seconds, seconds of a duration): the owner decides
    if isinstance(kind, str) and not _type_ok(kind, value):
        if kind == "object":
            msg = f"Input should be a valid dictionary or instance of {model_name(schema)}"
            errors.append({"loc": loc, "msg": msg})
        else:
            errors.append({"loc": loc, "msg": _TYPE_MESSAGES.get(kind, f"Input should be of type {kind}")})
        return
    if kind in ("integer", "number"):
        _bounds(schema, _number(value), loc, errors)
    elif kind == "string":
        _lengths(schema, len(value), "String", "character", loc, errors)
    elif kind == "array":
        _lengths(schema, len(value), "List", "item", loc, errors)
        item = schema.get("items")
        if isinstance(item, Mapping):
            for index, element in enumerate(value):
                _check(item, element, (*loc, index), errors, defs)
    elif (kind == "object" or "properties" in schema) and isinstance(value, Mapping):
        _object(schema, value, loc, errors, defs)


_TIMES = frozenset({"date-time", "date", "time", "duration"})  # the string formats pydantic also reads from numbers


def _numeric_choice(choices: list[Any], value: Any) -> bool:
    """Whether lax mode takes `value`, a numeric str such as "1", as one of an enum's number choices (IntEnum)."""
    if not isinstance(value, str):
        return False
    number = _number(value)
    return number is not None and any(
        isinstance(c, int | float) and not isinstance(c, bool) and c == number for c in choices
    )


def _bounds(
    schema: Mapping[str, Any], number: float | None, loc: tuple[Any, ...], errors: list[dict[str, Any]]
) -> None:
    if number is None:
        return
    for key, words in _BOUNDS.items():
        bound = schema.get(key)
        if not isinstance(bound, int | float) or isinstance(bound, bool):
            continue
        holds = {
            "minimum": number >= bound, "maximum": number <= bound,
            "exclusiveMinimum": number > bound, "exclusiveMaximum": number < bound,
        }[key]
        if not holds:
            errors.append({"loc": loc, "msg": f"Input should be {words} {bound}"})


_BOUNDS = {
    "minimum": "greater than or equal to",
    "maximum": "less than or equal to",
    "exclusiveMinimum": "greater than",
    "exclusiveMaximum": "less than",
}


def _lengths(
    schema: Mapping[str, Any], size: int, what: str, unit: str, loc: tuple[Any, ...], errors: list[dict[str, Any]]
) -> None:
    low, high = schema.get("minLength", schema.get("minItems")), schema.get("maxLength", schema.get("maxItems"))
    if isinstance(low, int) and size < low:
        errors.append({"loc": loc, "msg": f"{what} should have at least {low} {unit}{'' if low == 1 else 's'}"})
    if isinstance(high, int) and size > high:
        errors.append({"loc": loc, "msg": f"{what} should have at most {high} {unit}{'' if high == 1 else 's'}"})


def _object(
    schema: Mapping[str, Any], value: Mapping[str, Any], loc: tuple[Any, ...], errors: list[dict[str, Any]],
    defs: Mapping[str, Any],
) -> None:
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        return
    required = schema.get("required", [])
    missing = [name for name in (required if isinstance(required, list) else []) if name not in value]
    errors.extend({"loc": (*loc, name), "msg": "Field required"} for name in missing)
    for name, item in properties.items():
        if name in value and isinstance(item, Mapping):
            _check(item, value[name], (*loc, name), errors, defs)
    if schema.get("additionalProperties") is False:
        extra = [name for name in value if name not in properties]
        errors.extend({"loc": (*loc, name), "msg": "Extra inputs are not permitted"} for name in extra)

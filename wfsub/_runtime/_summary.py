"""Program summaries: what a registered program version can take, written to its store once per fingerprint,
so that a process without the program (the `wfsub` command, a `wfsub.Client`, a standby Substrate) can check an
input as the case's owner would before writing it to the inbox.

A summary is JSON:

    {"format": 3, "workflow": name, "root": the workflow's root node path,
     "input": the JSON Schema of the start data's model (`Workflow(term, input=Model)`), or None,
     "signals": {name: the JSON Schema of its payload model, or None},
     "updates": {name: the JSON Schema of its payload model, or None},   (the names an update can be sent to)
     "regions": {name: "scope" | "mi"},
     "compensations": {name: [node paths]},         (each saga compensation's name -> where it starts)
     "drawing": {"mermaid": text, "shapes": {node path: shape id}, "calls": {name: [node paths]}} or None}

`compensations` lets `wfsub show` say where each compensation a case's end names ran (the end records names).
`drawing` (format 3 on, written where a Substrate registers the version with its store) is the version's Mermaid
drawing (`wfsub._diagram.drawing_of`), so a process without the workflows (a `wfsub.Client`, the inspector of
`wfsub web STORE`) draws a case on the version it runs, with where it is marked (`mark_drawing`). A summary
written before has none: the inspector then draws from the workflows it is given, if any.

Each schema is the one pydantic writes for validation, with what a check needs besides (`Checked`): per object,
the other names its fields are taken by (`x-wfsub-names`: a field's name when the model populates by name, each
`AliasChoices` choice and `AliasPath`), and `x-wfsub-any` where a before, wrap or plain validator decides.

`payload_errors(schema, payload)` checks a payload against such a schema (the subset pydantic writes: types,
properties and required, items, enums and consts, anyOf, $ref into $defs, bounds on numbers and lengths, extra
properties forbidden). Errors come as pydantic gives them (`loc`, `msg`), so the refusal reads as the owner's. The
check itself (the refusal and its message) is in `wfsub._runtime._inputs`, the one module that checks inputs.

The rule: the check never refuses what the owner's model would take; where it cannot tell, it lets the input
through, and the owner, which validates again with the model itself, refuses it then (the refusal is kept in
`status().refused`). So:
- where pydantic's lax mode takes a value (the str "3" for an int, 1 for a bool, a number for a datetime or a
  timedelta, "1" for an IntEnum), so does the check; a str field of a model (or a field) that coerces numbers to
  str (`coerce_numbers_to_str`) takes anything here, the owner checks it;
- a field is found under each name the model takes it by, in the model's order; an `AliasPath` counts as given
  when its first key is there, and what it leads to is left to the owner;
- where a validator that runs before the type's own (a field's or `Annotated` `BeforeValidator`, `WrapValidator`
  or `PlainValidator`, a model's `mode="before"` validator) or a type pydantic cannot describe is, anything goes;
  validators that run after (`mode="after"`) only refuse more, so the check does not need them;
- a summary of format 1 (written before summaries listed the other names) cannot say whether a field was given
  under another name: a missing field and a key no property names are let through.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from .._program import Program, signal_waits
from .._store import ProgramSummary

SUMMARY_FORMAT = 3
"""The summary's `format`: 3 keeps the version's drawing; 2 lists the other names each field is taken by and marks
where validators decide; a summary without it (format 1, kept by a store from before) has the plain JSON Schemas
(see `payload_errors`)."""

NAMES = "x-wfsub-names"  # in an object schema: {property: [each path the model takes it by, in the model's order]}
ANY = "x-wfsub-any"  # in a schema: a validator of the model decides what it takes here, so the check lets it be


def summary_of(
    name: str, program: Program, input_model: type | None = None, *, drawn: bool = False
) -> ProgramSummary:
    """The summary of a registered program version (`input_model`: the model its start data must fit, from
    `Workflow(term, input=Model)`: its JSON Schema is kept, so a client refuses a bad start as the owner would).
    `drawn`: with the version's drawing (what a store keeps; a check of an input does not need it)."""
    signals: dict[str, Any] = {}
    for signal in sorted(program.signals):
        signals[signal] = model_schema(program.signal_models.get(signal))
    summary = {
        "format": SUMMARY_FORMAT,
        "workflow": name,
        "input": model_schema(input_model),
        "root": program.root_path,
        "signals": signals,
        "waits": signal_waits(program),  # each signal -> the node paths of the waits that take it (for refusals)
        "updates": {name: signals.get(name) for name in sorted(program.updates)},
        "regions": dict(sorted(program.regions.items())),
        "compensations": compensations_of(program),
        "drawing": drawing_of_version(program) if drawn else None,
    }
    return ProgramSummary(program.fingerprint, name, summary)


def drawing_of_version(program: Program) -> dict[str, Any] | None:
    """The drawing a summary keeps of a version (None: a workflow too big or too deep to draw, as `to_mermaid`
    refuses it: the summary is kept without one)."""
    from .._diagram import drawing_of  # (loaded only where a drawing is made: a Substrate does not need it to run)

    try:
        return drawing_of(program.term)
    except ValueError:
        return None


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


def model_schema(model: type | None) -> dict[str, Any] | None:
    """The JSON Schema of a payload or input model as it validates (`Checked`), None for no model."""
    schema = getattr(model, "model_json_schema", None)
    if not callable(schema):
        return None
    found: dict[str, Any] = schema(mode="validation", schema_generator=Checked)
    return found


class Checked(GenerateJsonSchema):
    """The JSON Schema pydantic writes for a model's validation, plus what a check needs that it leaves out:
    - each object schema's `x-wfsub-names`: the names (and `AliasPath`s) a field is also taken by, where they are
      more than its property name: a field's other `AliasChoices`, and its own name when the model populates by
      name (`populate_by_name`/`validate_by_name`);
    - `x-wfsub-any` where a before, wrap or plain validator (a field's, an `Annotated` one's or a model's
      `mode="before"`) decides what is taken: such a validator may take anything, so the check takes anything there
      (and on a str that `coerce_numbers_to_str` also takes numbers as);
    - a type pydantic cannot write a schema for is `{}` (anything), not an error."""

    def model_fields_schema(self, schema: core_schema.ModelFieldsSchema) -> JsonSchemaValue:
        return self._named(super().model_fields_schema(schema), list(schema["fields"].items()))

    def typed_dict_schema(self, schema: core_schema.TypedDictSchema) -> JsonSchemaValue:
        # (its own config: the config in force here is the enclosing model's once the super call has returned)
        own = schema.get("config")
        return self._named(super().typed_dict_schema(schema), list(schema["fields"].items()), own)

    def dataclass_args_schema(self, schema: core_schema.DataclassArgsSchema) -> JsonSchemaValue:
        fields = [(field["name"], field) for field in schema["fields"]]
        return self._named(super().dataclass_args_schema(schema), fields)

    def str_schema(self, schema: core_schema.StringSchema) -> JsonSchemaValue:
        found = super().str_schema(schema)
        config = getattr(getattr(self, "_config", None), "config_dict", None) or {}
        if schema.get("coerce_numbers_to_str", config.get("coerce_numbers_to_str")):
            return {**found, ANY: True}  # a number is taken too, as its str: what its lengths say is the owner's
        return found

    def function_before_schema(self, schema: core_schema.BeforeValidatorFunctionSchema) -> JsonSchemaValue:
        return {**super().function_before_schema(schema), ANY: True}

    def function_wrap_schema(self, schema: core_schema.WrapValidatorFunctionSchema) -> JsonSchemaValue:
        return {**super().function_wrap_schema(schema), ANY: True}

    def function_plain_schema(self, schema: core_schema.PlainValidatorFunctionSchema) -> JsonSchemaValue:
        return {**super().function_plain_schema(schema), ANY: True}

    def handle_invalid_for_json_schema(self, schema: Any, error_info: str) -> JsonSchemaValue:
        return {ANY: True}

    def _named(
        self, json_schema: JsonSchemaValue, fields: list[tuple[str, Any]], config: Mapping[str, Any] | None = None
    ) -> JsonSchemaValue:
        """`json_schema` (an object's) with the names its fields are also taken by (`NAMES`)."""
        properties = json_schema.get("properties")
        if not isinstance(properties, dict):
            return json_schema
        if config is None:  # the model's config in force (pydantic keeps it on the generator while it walks)
            config = getattr(getattr(self, "_config", None), "config_dict", None) or {}
        by_name = bool(config.get("validate_by_name") or config.get("populate_by_name"))
        by_alias = config.get("validate_by_alias", True) is not False
        names: dict[str, list[list[str | int]]] = {}
        for name, field in fields:
            paths = _paths(field.get("validation_alias")) if by_alias else []
            key = next((p[0] for p in paths if len(p) == 1 and isinstance(p[0], str)), name) if paths else name
            if by_name or not paths:
                paths.append([name])
            if key not in properties:  # named otherwise than this check can follow: the owner decides
                return {**json_schema, ANY: True}
            if paths != [[key]]:
                names[key] = paths
        return {**json_schema, NAMES: names} if names else json_schema


def _paths(alias: Any) -> list[list[str | int]]:
    """A core schema's `validation_alias` as the paths it names, in order: "a" -> [["a"]], an AliasPath ["a", 0]
    -> [["a", 0]], AliasChoices -> [[...], [...]]."""
    if isinstance(alias, str):
        return [[alias]]
    if isinstance(alias, list) and alias and all(isinstance(part, list) for part in alias):
        return [list(part) for part in alias if part]
    if isinstance(alias, list) and alias:
        return [list(alias)]
    return []


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


def payload_errors(schema: Mapping[str, Any], payload: Any, *, names: bool = True) -> list[dict[str, Any]]:
    """What a payload breaks of its model's JSON Schema, as pydantic's errors (`loc`, `msg`); [] if nothing.
    `names=False`: the schema may not list every name a field is taken by (a summary of format 1), so a field
    missing under its property name, or a key no property names, is let through."""
    errors: list[dict[str, Any]] = []
    defs = schema.get("$defs", {})
    _check(schema, payload, (), errors, defs if isinstance(defs, Mapping) else {}, names)
    return errors


def summary_names(summary: Mapping[str, Any]) -> bool:
    """Whether a summary lists every name its models take a field by (format 2 on; see `payload_errors`)."""
    found = summary.get("format")
    return isinstance(found, int) and found >= 2


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
    defs: Mapping[str, Any], names: bool = True,
) -> None:
    if schema.get(ANY):
        return
    schema = _resolve(schema, defs)
    if not schema or schema.get(ANY):
        return
    options = schema.get("anyOf")
    if isinstance(options, list) and options:
        for option in options:
            if isinstance(option, Mapping):
                trial: list[dict[str, Any]] = []
                _check(option, value, loc, trial, defs, names)
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
                _check(item, element, (*loc, index), errors, defs, names)
    elif (kind == "object" or "properties" in schema) and isinstance(value, Mapping):
        _object(schema, value, loc, errors, defs, names)


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
    defs: Mapping[str, Any], names: bool = True,
) -> None:
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        return
    listed = schema.get(NAMES)
    other_names: Mapping[str, Any] = listed if isinstance(listed, Mapping) else {}
    required = schema.get("required", [])
    needed = set(required) if isinstance(required, list) else set()
    used: set[Any] = set()
    for name, item in properties.items():
        paths = other_names.get(name)
        path = _given(paths if isinstance(paths, list) else [[name]], value)
        if path is None:
            if name in needed and names:
                errors.append({"loc": (*loc, name), "msg": "Field required"})
            continue
        used.add(path[0])
        if len(path) == 1 and isinstance(item, Mapping):  # (an AliasPath's value, deeper in: the owner checks it)
            _check(item, value[path[0]], (*loc, path[0]), errors, defs, names)
    if schema.get("additionalProperties") is False and names:
        extra = [name for name in value if name not in used]
        errors.extend({"loc": (*loc, name), "msg": "Extra inputs are not permitted"} for name in extra)


def _given(paths: list[Any], value: Mapping[str, Any]) -> list[Any] | None:
    """The first of a field's paths that `value` holds, as pydantic looks them up (None: the field is missing).
    An AliasPath counts as given when its first key is there (where it leads is the owner's to check)."""
    for path in paths:
        if isinstance(path, list) and path and path[0] in value:
            return path
        if isinstance(path, str) and path in value:
            return [path]
    return None

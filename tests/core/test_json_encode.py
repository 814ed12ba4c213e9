"""`wfsub._json.encode`: the C fast path answers exactly as the stdlib encoder it replaces, value for value."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wfsub._json import encode, output_problem

STDLIB = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode

# Unicode text: case data holds no NUL and no lone surrogate (each refused by name: the NUL tests below, the
# surrogate in tests/durable/test_races.py)
CHARACTERS = st.characters(exclude_characters="\x00", exclude_categories=("Cs",))
TEXT = st.text(CHARACTERS)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(CHARACTERS, max_size=8), inner, max_size=4),
    max_leaves=20,
)


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


@dataclasses.dataclass
class Point:
    x: int


def _outcome(fn: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", json.loads(fn(value))
    except (TypeError, ValueError) as exc:
        return "refused", type(exc)


@settings(deadline=None)  # a loaded machine must not fail a test about values
@given(JSON_VALUES)
def test_a_json_value_decodes_to_what_the_stdlib_text_decodes_to(value: Any) -> None:
    """Any JSON value: the text decodes (with the stdlib) to the same value as the stdlib's own text does."""
    assert json.loads(encode(value)) == json.loads(STDLIB(value))
    assert output_problem(value, "v") is None


@pytest.mark.parametrize("value", ["a\x00", {"k": ["\x00"]}, {"a\x00": 1}, {"k": "\\u0000 and \x00"}], ids=repr)
def test_a_nul_character_anywhere_is_named_as_not_case_data(value: Any) -> None:
    """A NUL in a str or a key (which Postgres's JSON cannot store) is a problem the walk names, fast path or not."""
    problem = output_problem(value, "v")
    assert problem is not None and "NUL character (U+0000)" in problem, problem


def test_the_six_characters_of_a_nul_escape_are_case_data() -> None:
    """A str holding a backslash, 'u' and four zeros (no NUL) is JSON a case keeps."""
    assert output_problem({"k": "\\u0000"}, "v") is None


@pytest.mark.parametrize(
    "value",
    [
        float("nan"), [1.0, float("inf")], {"when": datetime.datetime(2024, 1, 2)}, uuid.UUID(int=7), b"bytes",
        Color.RED, Point(1), {1: "int key"}, (1, [2, (3,)]), 2**70, -(2**80), {"k": Level.HIGH}, "\ud800",
    ],
    ids=repr,
)
def test_a_value_the_fast_encoder_would_bend_is_answered_as_the_stdlib_answers(value: Any) -> None:
    """NaN, datetimes, UUIDs, bytes, enums, dataclasses, int keys, tuples, huge ints: refused or written as the
    stdlib refuses or writes them (msgspec alone would write NaN as null and encode the others)."""
    assert _outcome(encode, value) == _outcome(STDLIB, value)
    if _outcome(STDLIB, value)[0] == "ok":
        assert encode(value) == STDLIB(value)


def test_a_cycle_is_refused_as_the_stdlib_refuses_it() -> None:
    """A value that contains itself: ValueError, as from the stdlib (not msgspec's RecursionError)."""
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(ValueError, match="Circular reference"):
        encode(loop)


def test_text_written_by_the_stdlib_and_by_encode_decode_alike() -> None:
    """A record as the stdlib wrote it before and as encode writes it now read back to the same value."""
    record = {"seq": 3, "kind": "effect", "time": 1795700821.2348967, "result": {"big": 2**64 + 1, "tiny": 1e-7,
              "huge": 1e16, "text": "é ✓"}, "digest": ""}
    assert json.loads(encode(record)) == json.loads(STDLIB(record)) == record


def test_output_problem_still_names_what_is_not_json() -> None:
    """The vm's check keeps its messages: a NaN and a datetime are named with their path."""
    assert "NaN" in (output_problem({"x": [math.nan]}, "output") or "")
    assert output_problem({"when": datetime.date(2024, 1, 1)}, "output") == (
        'output["when"]: date is not JSON; pass .isoformat()'
    )

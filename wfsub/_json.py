"""What counts as JSON for a durable case, and where a value stops being it (pure: the vm uses it too).

JSON here: dicts with str keys, lists (tuples become lists), str (valid Unicode: no lone surrogates), int, finite
float, bool and None. Data of a durable case is kept in a journal and replayed, so anything else is refused with
the path of the first offending value, `data["items"][2]["when"]: datetime is not JSON; pass .isoformat()`.

The encoder is msgspec's (C): on the records a durable case writes it encodes about ten times faster than the
stdlib `json` and decodes about five times faster (`python -m bench durable` prints the three side by side, with
orjson, which is as fast but refuses ints beyond 64 bits and decodes them back as floats). msgspec is more lenient
than this module's rule: it writes NaN as null and encodes datetimes, UUIDs, bytes and dataclasses. So a text it
makes is kept only when decoding it gives back a value equal to the one given, which no such value does; anything
else (those, a tuple, an int key, a cycle, a lone surrogate) goes to the stdlib encoder, which answers as before.
The text differs from the stdlib's only in how some floats are spelt (`1e16` for `1e+16`): every JSON decoder,
the stdlib's included, reads both as the same float, and text written by the stdlib reads as it always did.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgspec


def json_problem(value: Any, where: str) -> str | None:
    """Where `value` stops being JSON and why, or None. A walk with an explicit stack: any depth, and a value
    that contains itself is reported rather than followed."""
    stack: list[tuple[Any, str, bool]] = [(value, where, False)]
    active: set[int] = set()  # the containers on the path from the root to the value being looked at
    while stack:
        v, at, leaving = stack.pop()
        if leaving:
            active.discard(id(v))
            continue
        if v is None or isinstance(v, bool | int):
            continue
        if isinstance(v, str):
            if not v.isascii():
                try:
                    v.encode()
                except UnicodeEncodeError as exc:
                    return f"{at}: the str holds a lone surrogate {v[exc.start]!r}, which is not Unicode text"
            continue
        if isinstance(v, float):
            if not math.isfinite(v):
                return f"{at}: {v!r} is not JSON (no NaN or infinity); store None or a bound instead"
            continue
        if isinstance(v, list | tuple | dict):
            if id(v) in active:
                return f"{at}: the value contains itself (a cycle): JSON is a tree; store a copy or an id instead"
            active.add(id(v))
            stack.append((v, at, True))
            if isinstance(v, dict):
                for k, x in v.items():
                    if not isinstance(k, str):
                        return f"{at}: key {k!r} is {type(k).__name__}, but JSON keys are str; use str keys"
                    stack.append((x, f"{at}[{json.dumps(k, ensure_ascii=False)}]", False))
            else:
                stack.extend((x, f"{at}[{i}]", False) for i, x in enumerate(v))
            continue
        hint = "; pass .isoformat()" if hasattr(v, "isoformat") else "; convert it to str, a number, a list or a dict"
        return f"{at}: {type(v).__name__} is not JSON{hint}"
    return None


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_fast_encode = msgspec.json.Encoder().encode
_fast_decode = msgspec.json.Decoder().decode


def encode(value: Any) -> str:
    """Compact JSON text (non-ASCII kept as is) of a JSON value; TypeError or ValueError for anything else (a
    NaN, a datetime, a cycle), as `json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)`
    answers. Fast for a plain JSON value (see the module docstring); ints and dict keys as the stdlib takes them."""
    try:
        raw = _fast_encode(value)
        if _fast_decode(raw) == value:
            return raw.decode()
    except Exception:  # RecursionError, UnicodeEncodeError, msgspec.EncodeError: the stdlib says what it says
        pass
    return _dumps(value)


def decode(text: str | bytes) -> Any:
    """The value of a JSON text, as `json.loads` gives it: msgspec's decoder (about five times faster, and
    exact for ints of any size); a text it refuses (NaN, Infinity, a lone surrogate escape) goes to the stdlib."""
    try:
        return _fast_decode(text)
    except msgspec.DecodeError:
        return json.loads(text)


def journaled(value: Any) -> tuple[Any, int] | None:
    """(the value as decoded from its JSON, the size in bytes of that JSON) when the fast encoder's text decodes
    back equal, with the same outer type, to `value`; None when it does not (the caller's walk then says why)."""
    try:
        raw = _fast_encode(value)
        decoded = _fast_decode(raw)
    except Exception:  # RecursionError, msgspec.EncodeError (a lone surrogate, an int beyond 64 bits)
        return None
    if decoded != value or type(decoded) is not type(value):
        return None
    return decoded, len(raw)


def output_problem(value: Any, where: str) -> str | None:
    """`json_problem`, fast for the common case: a value that encodes and decodes back equal (all in C) is JSON;
    only one that does not (a tuple, an int key, a datetime, a NaN, a cycle) takes the walk."""
    try:
        if _fast_decode(_fast_encode(value)) == value:  # the encode refuses lone surrogates (its output is UTF-8)
            return None
    except Exception:  # RecursionError, UnicodeEncodeError, msgspec.EncodeError: the walk names the problem
        pass
    return json_problem(value, where)

"""What counts as JSON for a durable case, and where a value stops being it (pure: the vm uses it too).

JSON here: dicts with str keys, lists (tuples become lists), str (valid Unicode: no lone surrogates, and no NUL
character, which Postgres's JSON cannot hold), int, finite float, bool and None. Data of a durable case is kept in a
journal and replayed, so anything else is refused with the path of the first offending value,
`data["items"][2]["when"]: datetime is not JSON; pass .isoformat()`.

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
import sys
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
        if v is None or isinstance(v, bool):
            continue
        if isinstance(v, int):
            if -(big := _too_big()) < v < big:
                continue
            return long_int(at)
        if isinstance(v, str):
            if "\x00" in v:
                return (f"{at}: the str holds a NUL character (U+0000) at index {v.index(chr(0))}, which case data may "
                        "not hold (Postgres cannot store it in JSON, and a case keeps only what every store keeps); "
                        "remove it, or encode the text (base64)")
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
                    if "\x00" in k:
                        return (f"{at}: key {k!r} holds a NUL character (U+0000), which case data may not hold "
                                "(Postgres cannot store it in JSON); remove it")
                    stack.append((x, f"{at}[{json.dumps(k, ensure_ascii=False)}]", False))
            else:
                stack.extend((x, f"{at}[{i}]", False) for i, x in enumerate(v))
            continue
        if isinstance(v, LongDigits):  # (an int literal of a JSON text, too long to read: `loads_long`)
            return long_int(at, v.digits)
        hint = "; pass .isoformat()" if hasattr(v, "isoformat") else "; convert it to str, a number, a list or a dict"
        return f"{at}: {type(v).__name__} is not JSON{hint}"
    return None


def int_digits() -> int:
    """The most decimal digits an int of case data may have: as many as Python turns into text and back by default
    (4,300: `sys.int_info.default_max_str_digits`), or the lower limit this process set. An int kept in a journal
    is JSON text, which every process that reads the store must turn back into an int."""
    default = sys.int_info.default_max_str_digits
    mine = sys.get_int_max_str_digits()
    return min(mine, default) if mine else default


_BIG: dict[int, int] = {}  # digits -> 10 ** digits (the smallest int with one digit more)


def _too_big() -> int:
    digits = int_digits()
    big = _BIG.get(digits)
    if big is None:
        big = _BIG[digits] = 10**digits
    return big


def long_int(at: str, digits: int | None = None) -> str:
    """What is wrong with an int of case data with more than `int_digits()` digits."""
    limit = int_digits()
    size = f"of {digits:,} digits" if digits is not None else f"of more than {limit:,} digits"
    return (f"{at}: an int {size}, longer than case data may hold (at most {limit:,} digits, the longest int "
            "Python turns into text and back: sys.get_int_max_str_digits()); send it as a str")


class LongDigits:
    """An int literal of a JSON text with more digits than `int_digits()` (`loads_long`): not read as an int, so
    that `json_problem` can name where it is."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits


def loads_long(text: str | bytes) -> tuple[Any, bool]:
    """`json.loads`, with an int literal too long to read (see `int_digits`) given as a `LongDigits` where it is,
    instead of Python's ValueError that names no place; and whether there was one."""
    limit = int_digits()
    found = False

    def parse_int(literal: str) -> int | LongDigits:
        nonlocal found
        digits = len(literal) - literal.startswith("-")
        if digits <= limit:
            return int(literal)
        found = True
        return LongDigits(digits)

    return json.loads(text, parse_int=parse_int), found


MAX_DEPTH = 200
"""How deep an input may nest lists and dicts (a payload, add_instances items, start data): well under Python's
recursion limit, so every walk a value takes on its way (copies, pydantic, encoders) can follow it."""


_NESTS = (list, tuple, dict)


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` nests lists, tuples and dicts more than `limit` levels deep. No recursion: any depth.

    A walk level by level (a wide level: each container once, however often it is held there), which costs little
    for the usual shallow value; a value found deeper than `limit` is walked again along its paths, so that one
    that contains itself (a cycle, which only a case in memory may hold) is not counted as too deep."""
    if not isinstance(value, _NESTS):
        return False
    level: list[Any] = [value]
    depth = 1
    while True:
        below: list[Any] = []
        for v in level:
            below += [x for x in (v.values() if isinstance(v, dict) else v) if isinstance(x, _NESTS)]
        if not below:
            return False
        depth += 1
        if depth > limit:
            return _deeper_along_paths(value, limit)
        level = list({id(x): x for x in below}.values()) if len(below) > 64 else below  # (a value held twice)


def _deeper_along_paths(value: Any, limit: int) -> bool:
    """`too_deep` along each path from the root, a container met again on its own path not followed round."""
    stack: list[tuple[Any, int, bool]] = [(value, 1, False)]
    active: set[int] = set()  # the containers on the path from the root to the one being looked at
    while stack:
        v, depth, leaving = stack.pop()
        if leaving:
            active.discard(id(v))
            continue
        if depth > limit:
            return True
        if id(v) in active:
            continue
        active.add(id(v))
        stack.append((v, depth, True))
        inside = v.values() if isinstance(v, dict) else v
        stack.extend((x, depth + 1, False) for x in inside if isinstance(x, _NESTS))
    return False


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


_NUL = b"\\u0000"  # how the encoder writes a NUL character in a str


def journaled(value: Any) -> tuple[Any, int] | None:
    """(the value as decoded from its JSON, the size in bytes of that JSON) when the fast encoder's text decodes
    back equal, with the same outer type, to `value`; None when it does not (the caller's walk then says why)."""
    try:
        raw = _fast_encode(value)
        decoded = _fast_decode(raw)
    except Exception:  # RecursionError, msgspec.EncodeError (a lone surrogate, an int beyond 64 bits)
        return None
    if _NUL in raw:  # a NUL in a str (or the six characters of its escape): the walk says which
        return None
    if decoded != value or type(decoded) is not type(value):
        return None
    return decoded, len(raw)


def output_problem(value: Any, where: str) -> str | None:
    """`json_problem`, fast for the common case: a value that encodes and decodes back equal (all in C) is JSON;
    only one that does not (a tuple, an int key, a datetime, a NaN, a cycle, data nested too deep for the C
    encoders) takes the walk, and then a value nested deeper than `MAX_DEPTH` is refused as an input is."""
    try:
        raw = _fast_encode(value)
        if _NUL not in raw and _fast_decode(raw) == value:  # the encode refuses lone surrogates (output: UTF-8)
            return None
    except Exception:  # RecursionError, UnicodeEncodeError, msgspec.EncodeError: the walk names the problem
        pass
    problem = json_problem(value, where)
    if problem is None and too_deep(value):
        return (f"{where}: nested deeper than {MAX_DEPTH} levels of lists and dicts, the most a durable case's data "
                "may nest (it is encoded, digested and copied by walks that follow it); flatten it")
    return problem

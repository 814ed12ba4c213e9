"""What counts as JSON for a durable case, and where a value stops being it (pure: the vm uses it too).

JSON here: dicts with str keys, lists (tuples become lists), str (valid Unicode: no lone surrogates), int, finite
float, bool and None. Data of a durable case is kept in a journal and replayed, so anything else is refused with
the path of the first offending value, `data["items"][2]["when"]: datetime is not JSON; pass .isoformat()`.
"""

from __future__ import annotations

import json
import math
from typing import Any


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


def output_problem(value: Any, where: str) -> str | None:
    """`json_problem`, fast for the common case: a value that encodes and decodes back equal (all in C) is JSON;
    only one that does not (a tuple, an int key, a datetime, a NaN, a cycle) takes the walk."""
    try:
        text = _dumps(value)
        text.encode()
        if json.loads(text) == value:
            return None
    except (TypeError, ValueError, RecursionError):
        pass
    return json_problem(value, where)

"""The journal of a durable case: its record kinds, building them, and the JSON rule for what goes in.

A case is a deterministic function of its program, its start data and its inputs at their positions in the run
(the vm step count at which each was applied), so its journal holds exactly those:

    start            {seq: 0, kind, case_id, workflow, fingerprint, data, scheduler, deadline, time, tags?,
                      forked_from? {case_id, seq}, sent?}
    signal           {seq, kind, step, time, digest, name, payload, request_id?}
    effect           {seq, kind, step, time, digest, effect_id, path, name, result | error}
    timer            {seq, kind, step, time, digest, timer_id, path}
    cancel           {seq, kind, step, time, digest, reason, compensate, request_id?}
    cancel_region, complete_region, close_instances
                     {seq, kind, step, time, digest, region, request_id?}
    add_instances    {seq, kind, step, time, digest, region, items, request_id?}
    version          {seq, kind, step, time, digest, from, to}
    retry            {seq, kind, step, time, digest, run, ended?, redo}
    end              {seq, kind, time, outcome, result? | error? | reason?, run?}

A start's `data` is what the case starts with (the workflow's input model's JSON dump, defaults filled in, when it
has one); `sent` is the data as its caller sent it, kept only where it differs from `data`, so a start repeated
with the same data is the same start whichever door (an owner, a standby, a client) took each
(`_same_start.same_data`).

A `retry` (`Substrate.retry`) re-opens a failed case: a replay drops the `end` at seq `ended` and the effect
outcomes at the seqs in `redo` (the failed effect runs again), then applies the records after the retry. `run`
counts the retries so far; an `end` after a retry carries it, so a case still ends once per run.

`digest` is the running digest of the task outputs since the previous record (`Machine.take_digest`), so a task
that is not deterministic is caught at the first record after it. Tasks and the region steps inside a workflow
are not journaled: they are part of the program and re-run on replay. Retried attempts are not inputs: only an
effect's final outcome is.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from .._errors import too_deep as too_deep_error
from .._json import MAX_DEPTH, journaled, json_problem, too_deep
from .._store import Record

INPUT_KINDS = frozenset(
    {"signal", "effect", "timer", "cancel", "cancel_region", "complete_region", "add_instances", "close_instances",
     "version", "retry"}
)
ERROR_TEXT_LIMIT = 8_000  # stored error messages and tracebacks are cut to this many characters


class JournalRecord(BaseModel):
    """One record of a case's journal, as `Substrate.journal(case_id)` returns it (the kind's fields as extras)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    seq: int
    kind: str
    time: float
    step: int | None = None
    digest: str | None = None


def plain(value: Any, _active: frozenset[int] = frozenset()) -> Any:
    """Pydantic models dumped in JSON mode, anywhere in the value; everything else as given (a container that
    holds itself is left as it is, for `json_problem` to name)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping | list | tuple):
        if id(value) in _active:
            return value
        inner = _active | {id(value)}
        if isinstance(value, Mapping):
            return {k: plain(v, inner) for k, v in value.items()}
        return [plain(v, inner) for v in value]
    return value


_ATOMS = (str, int, float, bool, type(None), bytes)


def copy_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of case data that shares nothing mutable with it (what `data()` and `result()` hand out).

    Dicts and lists, which is what case data is made of, are copied here; str, numbers, bool, None and bytes are
    shared (they cannot change); anything else goes through `copy.deepcopy`, and a value that cannot be copied
    (a lock, a connection: only an in-memory case can hold one) is handed out as it is, so the result of a case
    that finished stays readable.
    """
    out = dict(data)
    for key, value in out.items():
        if type(value) not in _ATOMS:  # (atoms, the usual values, are shared without a call)
            out[key] = _copied(value)
    return out


def _copied(value: Any) -> Any:
    try:
        return _copied_nested(value)
    except RecursionError:  # deeper than Python's recursion follows, or a value that holds itself
        return _copied_deep(value)


def _copied_nested(value: Any) -> Any:
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is dict:
        return {key: _copied_nested(v) for key, v in value.items()}
    if kind is list:
        return [_copied_nested(v) for v in value]
    return _other(value)


def _copied_deep(value: Any) -> Any:
    """`_copied` with an explicit stack: any depth (a task of a case in memory may return data nested deeper than
    an input may be), sharing kept as it was (a list held twice is copied once, a value that holds itself is
    copied holding its copy)."""
    kind = type(value)
    if kind is not dict and kind is not list:
        return _other(value)
    top: Any = {} if kind is dict else []
    copies: dict[int, Any] = {id(value): top}
    stack: list[tuple[Any, Any]] = [(value, top)]
    while stack:
        source, target = stack.pop()
        pairs = source.items() if type(source) is dict else enumerate(source)
        is_dict = type(target) is dict
        for key, v in pairs:
            vkind = type(v)
            if vkind in _ATOMS:
                new = v
            elif vkind is dict or vkind is list:
                new = copies.get(id(v))
                if new is None:
                    new = copies[id(v)] = {} if vkind is dict else []
                    stack.append((v, new))
            else:
                new = _other(v)
            if is_dict:
                target[key] = new
            else:
                target.append(new)
    return top


def _other(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except Exception:  # copy raises whatever the object's __reduce_ex__ raises (TypeError for a lock, RecursionError)
        return value


def as_journaled(value: Any, where: str, limit: int | None = None) -> tuple[Any, int]:
    """The value as the journal will give it back (pydantic models dumped, tuples as lists), and its JSON size.

    Raises TypeError naming the path of a value that is not JSON, and ValueError naming `max_payload_bytes` when
    the encoded value is larger than `limit`. Nothing is written before this has passed.

    The common case costs an encode, a decode and a comparison, all in C: a value that comes back equal is JSON
    as it stands. Only a value that does not (a model, a tuple, an int key, a NaN, a datetime) takes the walk that
    converts models and tuples and names the first offending path.
    """
    fast = journaled(value)
    if fast is not None:
        decoded, size = fast
    else:
        if too_deep(value):  # (inputs are refused deeper at their door: this is for any other value)
            raise too_deep_error(where, MAX_DEPTH) from None
        problem = json_problem(value, where)  # first: it names cycles, surrogates and keys before anything else
        if problem is not None and not _models_in(value):
            raise TypeError(problem) from None
        value = plain(value)
        problem = json_problem(value, where)
        if problem is not None:
            raise TypeError(problem) from None
        text = _dumps(value)
        size = len(text) if text.isascii() else len(text.encode())
        decoded = json.loads(text)
    if limit is not None and size > limit:
        raise ValueError(
            f"{where} is {size:,} bytes of JSON, more than max_payload_bytes={limit:,}: keep large payloads "
            "elsewhere (a file, an object store) and pass a reference, or raise Substrate(max_payload_bytes=...)"
        )
    return decoded, size


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def _models_in(value: Any) -> bool:
    """Whether a pydantic model is anywhere in `value` (then `plain` must run before the JSON check)."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if isinstance(v, BaseModel):
            return True
        if isinstance(v, Mapping | list | tuple) and id(v) not in seen:
            seen.add(id(v))
            stack.extend(v.values() if isinstance(v, Mapping) else v)
    return False


def start_record(
    case_id: str, workflow: str, fingerprint: str, data: dict[str, Any] | None, seed: int | None,
    deadline: float | None, now: float, tags: Mapping[str, str] | None = None, parent: str | None = None,
    cancel_with_parent: bool = False, sent: Mapping[str, Any] | None = None,
    parent_step: Mapping[str, Any] | None = None, waited: bool = False,
) -> Record:
    """The `start` record of a case (seq 0): what it started from, with its scheduler (`seed`: Seeded(seed)), its
    tags (kept only when there are some, so an untagged start reads as before), and for a child case
    (`start_case`) its `parent`, and `cancel_with_parent: true` when its parent waits for it and cancels it when it
    withdraws the step (so a parent that ended before its cancel reached the child still cancels it), with
    `parent_step` naming that step ({"effect_id", "path"}: its row keeps it too, so a parent that withdrew the
    step and died before cancelling the child is found, and the cancel has the step's own request id), and
    `waited: true` when its parent waits for its end (`start_case(wait=True)`, "cancel" or "abandon": `delete` of
    the parent deletes it too). `sent`: the data as the caller sent it (JSON), kept when the input model made
    `data` differ from it (see the module)."""
    scheduler = {"kind": "deterministic"} if seed is None else {"kind": "seeded", "seed": seed}
    start: Record = {"seq": 0, "kind": "start", "case_id": case_id, "workflow": workflow, "fingerprint": fingerprint,
                     "data": data, "scheduler": scheduler, "deadline": deadline, "time": now}
    _start_fields(start, data, tags, parent, cancel_with_parent, sent, parent_step, waited)
    return start


def queued_start(
    workflow: str | None, data: Mapping[str, Any] | None, timeout: float | None, seed: int | None,
    tags: Mapping[str, str] | None, parent: str | None = None, cancel_with_parent: bool = False,
    sent: Mapping[str, Any] | None = None, parent_step: Mapping[str, Any] | None = None, waited: bool = False,
) -> dict[str, Any]:
    """What a queue item keeps of a start to start the case with at dequeue: the fields of its `start` record that
    a start is asked with (`start_record`; its deadline as a `timeout` from the start, its scheduler as `seed`)."""
    start: dict[str, Any] = {"workflow": workflow, "data": data, "timeout": timeout, "seed": seed}
    _start_fields(start, data, tags, parent, cancel_with_parent, sent, parent_step, waited)
    return start


def _start_fields(
    start: dict[str, Any], data: Mapping[str, Any] | None, tags: Mapping[str, str] | None, parent: str | None,
    cancel_with_parent: bool,
    sent: Mapping[str, Any] | None, parent_step: Mapping[str, Any] | None, waited: bool,
) -> None:
    """The fields a start keeps only when given (a start record and a queued start alike), so a start without them
    reads as before they were kept."""
    if tags:
        start["tags"] = dict(tags)
    if parent is not None:
        start["parent"] = parent
    if cancel_with_parent or parent_step is not None:
        start["cancel_with_parent"] = True
    if parent_step is not None:
        start["parent_step"] = dict(parent_step)
    if waited:
        start["waited"] = True
    if sent is not None and dict(sent) != dict(data or {}):
        start["sent"] = dict(sent)


def parent_step_of(start: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parent's step a `start` record (or a queued start) names (see `start_record`), or None."""
    step = start.get("parent_step")
    if isinstance(step, Mapping) and isinstance(step.get("effect_id"), int) and isinstance(step.get("path"), str):
        return {"effect_id": step["effect_id"], "path": step["path"]}
    return None


def waited_of(start: Mapping[str, Any]) -> bool:
    """Whether a `start` record (or a queued start) is a child's whose parent waits for its end (see
    `start_record`; a child started before `waited` was kept says so by `cancel_with_parent` alone)."""
    return bool(start.get("waited") or start.get("cancel_with_parent"))


def input_record(seq: int, kind: str, step: int | None, now: float, digest: str | None, **fields: Any) -> Record:
    """An input record (see the module docstring for each kind's fields)."""
    return {"seq": seq, "kind": kind, "step": step, "time": now, "digest": digest, **fields}


def effective(records: Sequence[Record]) -> list[Record]:
    """The records a replay applies, in order: each `retry` drops the `end` it re-opened and the effect outcomes
    it runs again (see the module docstring); every other record as it is."""
    dropped: set[int] = set()
    for record in records:
        if record.get("kind") == "retry":
            if record.get("ended") is not None:
                dropped.add(int(record["ended"]))
            dropped.update(int(seq) for seq in record.get("redo") or ())
    if not dropped:
        return list(records)
    return [record for record in records if int(record.get("seq", -1)) not in dropped]


def end_record(
    seq: int, now: float, outcome: str, digest: str | None = None, *, result: Any = None,
    error: dict[str, Any] | None = None, reason: str | None = None, compensated: Sequence[str] = (), run: int = 0,
) -> Record:
    """The `end` record of a case: its outcome with the final data (done), the error (failed) or the reason
    (cancelled, with what its compensations undid when they ran); `digest` covers the tasks run since the last
    input (None: none were run, or none are known)."""
    end: Record = {"seq": seq, "kind": "end", "time": now, "outcome": outcome, "digest": digest}
    if outcome == "done":
        end["result"] = result
    elif outcome == "failed":
        end["error"] = error
    else:
        end["reason"] = reason
        if compensated:
            end["compensated"] = list(compensated)
    if run:
        end["run"] = run
    return end


def error_body(exc: BaseException, traceback: str | None = None) -> dict[str, Any]:
    """How an effect's failure is journaled: type name, message and traceback, bounded in size."""
    body: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)[:ERROR_TEXT_LIMIT]}
    if traceback:
        body["traceback"] = traceback[-ERROR_TEXT_LIMIT:]
    return body

"""Inputs from outside a case, checked in one place, whatever door they come through.

An input is a kind and a body: `signal {name, payload}`, `cancel {reason, compensate}`, `cancel_region`,
`complete_region`, `close_instances {region}`, `add_instances {region, items}`. It reaches a case through the
API (`Substrate.signal`, a `CaseHandle`, ...), the store's inbox (the `wfsub` command, an outside writer, another
node) or a call that another node makes for one of its cases. Every door goes the same route:

1. `shaped(kind, body, ...)` (or, from the API, `signal`, `cancel`, `region`, which build the same message
   without a dict) checks what can be checked without the case (the kind, a field the kind does not have, field
   types, a blank reason, items that are not a list, data nested deeper than `MAX_DEPTH`: `shallow`) and returns
   the mailbox message. Nothing is queued or written before it has passed. A cancel reason is bounded by a durable
   case's `max_payload_bytes` as a payload is (`bounded_reason`, where the limit is known).
2. At the case: `admit(msg, machine, limit)` runs the vm's own check once (`Machine.check_signal`, whose answer
   is the payload as stored; `Machine.check_region`) and, for a durable case (`limit` given), turns what the
   message carries into the JSON its journal record will give back (`as_journaled`, once). The actor then
   journals the message as it is and delivers it without checking it again (`deliver_signal(checked=True)`).
   For a case on another node, `inbox_body(msg, limit)` is what goes to the inbox instead (JSON, within the
   limit); its owner takes it through step 1 and 2 again, as it takes any inbox row.

3. For a case that no process here runs (the `wfsub` command, a `wfsub.Client`, a standby Substrate), before the
   input is written to the inbox: `against_summary(msg, summary, case_id)` checks it against the program summary
   of the case's recorded version (`_summary`), with the same refusals the owner would make.

Refusals are made by the builders in `wfsub._errors` (`bad_input`, `SignalRejected`), so a refusal reads the
same from every door. `start` (the data of `new_case`) is checked by `start_data` here too, against the input
model its workflow was registered with (`Workflow(term, input=Model)`), whichever door starts the case.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from .._errors import NOTHING, InvalidStartData, SignalRejected, bad_input, too_deep
from .._json import MAX_DEPTH
from .._json import too_deep as nested_too_deep
from ._journal import as_journaled, plain
from ._mailbox import ACTION_OF_KIND, Cancel, External, RegionAction, RegionOp, Reply, Signal
from ._status import CaseState
from ._summary import model_name, payload_errors, summary_names

if TYPE_CHECKING:
    from .._store import CaseRow
    from .._vm import Machine

KINDS = ("signal", "update", "cancel", *ACTION_OF_KIND)
"""Every input kind a case takes from outside, as the inbox and the journal spell them."""

DEFAULT_REASON = "cancelled"

FIELDS = {
    "signal": ("name", "payload"), "update": ("name", "payload"), "cancel": ("reason", "compensate"),
    "add_instances": ("region", "items"),
}
"""The body fields each input kind takes (a region kind not named here takes `region` only)."""


def shallow(value: Any, what: str, case_id: str | None = None) -> Any:
    """`value` as given, if it nests lists and dicts at most `MAX_DEPTH` levels deep (every input with data is
    checked here once, at its door: deeper data would fail with RecursionError in the walks it takes later)."""
    if nested_too_deep(value, MAX_DEPTH):
        raise too_deep(what, MAX_DEPTH, case_id=case_id)
    return value


def loads_input(text: str | bytes, what: str = "the payload", case_id: str | None = None) -> Any:
    """The value of an input's JSON text (the command's PAYLOAD, the inspector's form): `json.loads`, but text
    nested deeper than the parser follows (far deeper than `MAX_DEPTH`) is refused as `shallow` refuses a value,
    not with RecursionError. Text that is not JSON raises `json.JSONDecodeError` (a ValueError) as it does."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise too_deep(what, MAX_DEPTH, case_id=case_id) from None
    return value


def signal_payload(name: str, payload: Any, case_id: str | None = None) -> Any:
    """`shallow` for a signal's payload (a container is walked; anything else costs a type check)."""
    if isinstance(payload, list | tuple | dict):
        shallow(payload, f"the payload of signal {name!r}", case_id)
    return payload


def bounded_reason(msg: Cancel, limit: int | None, case_id: str | None = None) -> None:
    """A cancel reason within `limit` (a durable case's `max_payload_bytes`) as JSON, as a payload is: it is kept
    in the case's journal and status."""
    if limit is not None and len(msg.reason) * 6 + 2 > limit:  # (6: the most bytes of JSON a character takes)
        _, size = as_journaled(msg.reason, "the cancel reason", None)
        if size > limit:
            raise bad_input(
                f"the cancel reason is {size:,} bytes of JSON, more than max_payload_bytes={limit:,}", NOTHING,
                case_id=case_id, error=ValueError,
                fix="give a short reason people will read and keep the details elsewhere (a file, a ticket "
                "system) with a reference in the reason, or raise Substrate(max_payload_bytes=...)",
            )


def request_id(value: object, case_id: str | None = None) -> str | None:
    """A request id: None, or a non-empty str."""
    if value is not None and (not isinstance(value, str) or not value):
        raise bad_input("request_id must be a non-empty str (or None)", value, case_id=case_id,
                        fix="pass the same id when you retry a call, so it applies once")
    return value


def reason(value: object, case_id: str | None = None) -> str:
    """A cancel reason: a str with something to read (kept in the case's status and journal)."""
    if not isinstance(value, str) or not value.strip():
        raise bad_input("reason must be a non-empty str, not blank", value, case_id=case_id,
                        fix="give a reason people will read (it is kept in the case's status and journal), "
                        "e.g. 'customer asked'")
    return value


def compensate(value: object, case_id: str | None = None) -> bool:
    if not isinstance(value, bool):
        raise bad_input("compensate must be True or False", value, case_id=case_id,
                        fix="True runs the compensations first, False ends the case at once")
    return value


def signal_name(value: object, case_id: str | None = None) -> str:
    if not isinstance(value, str):
        raise bad_input("signal names are str (non-empty)", value, case_id=case_id,
                        fix="pass the name the workflow waits for, e.g. signal(case_id, 'approve')")
    if not value:
        raise bad_input("signal names are str (non-empty)", value, case_id=case_id,
                        fix="an empty name is no signal; pass the name the workflow waits for")
    return value


def region_name(value: object, case_id: str | None = None) -> str:
    if not isinstance(value, str):
        raise bad_input("region names are str (non-empty)", value, case_id=case_id,
                        fix="pass the name given to scope(name, ...) or mi(..., name=...)")
    if not value:
        raise bad_input("region names are str (non-empty)", value, case_id=case_id,
                        fix="an empty name is no region; pass the name given to scope(name, ...) or mi(..., name=...)")
    return value


def items(value: object, case_id: str | None = None) -> list[Any]:
    """The items of `add_instances`: a sequence (not a str), as a list."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise bad_input("add_instances takes a sequence of items (e.g. a list)", value, case_id=case_id,
                        fix="pass a list with one item per instance to add")
    return list(value)


def signal(
    name: object, payload: Any, rid: object = None, case_id: str | None = None, reply: Reply | None = None
) -> Signal:
    """A signal from the API, checked as `shaped("signal", ...)` checks one from the inbox."""
    if type(name) is not str or not name:  # (the common case checked inline: it is on every signal's way)
        name = signal_name(name, case_id)
    if rid is not None:
        rid = request_id(rid, case_id)
    return Signal(name, signal_payload(name, payload, case_id), reply, 0, rid)


def update(name: object, payload: Any, rid: object = None, case_id: str | None = None) -> Signal:
    """An update from the API or the inbox: a signal whose sender waits for its answer. Its request id is the
    update's id (one is made when none is given): the owner keeps the answer under it, and a call repeated with
    it gets the first call's answer."""
    msg = signal(name, payload, rid, case_id)
    if msg.request_id is None:
        msg.request_id = f"update-{uuid.uuid4().hex}"
    msg.update = True
    return msg


def cancel(
    why: object, comp: object = True, rid: object = None, case_id: str | None = None, reply: Reply | None = None
) -> Cancel:
    """A cancel from the API, checked as `shaped("cancel", ...)` checks one from the inbox."""
    return Cancel(reason(why, case_id), compensate(comp, case_id), reply, 0, request_id(rid, case_id))


def region(
    action: RegionAction, name: object, given: object = None, rid: object = None, case_id: str | None = None,
    reply: Reply | None = None,
) -> RegionOp:
    """A region operation from the API, checked as `shaped(kind, ...)` checks one from the inbox."""
    name = region_name(name, case_id)
    listed = None
    if action is RegionAction.ADD_INSTANCES:
        listed = plain(shallow(items(given, case_id), f"the items of add_instances({name!r})", case_id))
    elif given is not None:
        raise bad_input(f"{action.kind} takes no items", given, case_id=case_id,
                        fix="only add_instances takes items")
    return RegionOp(action, name, listed, reply, 0, request_id(rid, case_id))


def shaped(
    kind: object, body: object, rid: object = None, *, case_id: str | None = None, inbox_id: int = 0,
) -> External:
    """The message that (kind, body) stands for, its fields checked (nothing about the case yet)."""
    if not isinstance(body, Mapping):
        raise bad_input(f"the body of a {kind} input must be a dict of its fields", body, case_id=case_id,
                        fix="e.g. {'name': 'approve', 'payload': {...}} for a signal")
    msg: External
    if kind in FIELDS or kind in ACTION_OF_KIND:
        assert isinstance(kind, str)
        takes = FIELDS.get(kind, ("region",))
        unknown = [key for key in body if key not in takes and not (key == "items" and kind in ACTION_OF_KIND)]
        if unknown:  # (an `items` of another region kind: `region` says only add_instances takes items)
            named = ", ".join(repr(key) for key in unknown)
            raise bad_input(
                f"a {kind} input has no field{'s' if len(unknown) > 1 else ''} {named}", NOTHING, case_id=case_id,
                fix=f"its fields are {', '.join(repr(field) for field in takes)}: check the spelling (a field it "
                "does not have would otherwise be left unused)",
            )
    if kind == "signal":
        msg = signal(body.get("name"), body.get("payload"), rid, case_id)
    elif kind == "update":
        msg = update(body.get("name"), body.get("payload"), rid, case_id)
    elif kind == "cancel":
        msg = cancel(body.get("reason", DEFAULT_REASON), body.get("compensate", True), rid, case_id)
    else:
        action = ACTION_OF_KIND.get(kind) if isinstance(kind, str) else None
        if action is None:
            raise bad_input(f"unknown input kind {kind!r}", NOTHING, case_id=case_id, error=ValueError,
                            fix=f"the kinds are {', '.join(KINDS)}")
        msg = region(action, body.get("region"), body.get("items"), rid, case_id)
    msg.inbox_id = inbox_id
    return msg


def admit(msg: External, machine: Machine, limit: int | None) -> None:
    """The case's own check of an input, once (see the module): raises what the case would refuse it with.

    `limit`: a durable case's `max_payload_bytes` (what the message carries becomes the JSON its record gives
    back); None for a case in memory only (nothing is converted). `Substrate._signal` inlines the signal branch
    for a case in memory only: it is the signal round trip's hot path."""
    kind = type(msg)
    if kind is Signal:
        assert isinstance(msg, Signal)
        payload = machine.check_update(msg.name, msg.payload) if msg.update else machine.check_signal(msg.name,
                                                                                                       msg.payload)
        if limit is not None:
            payload, _ = as_journaled(payload, f"signal {msg.name!r} payload", limit)
        msg.payload = payload
    elif kind is RegionOp:
        assert isinstance(msg, RegionOp)
        machine.check_region(msg.action.value, msg.name)
        if limit is not None and msg.items is not None:
            msg.items, _ = as_journaled(msg.items, f"add_instances({msg.name!r}) items", limit)
    # a cancel needs nothing of the case (its reason's size: `bounded_reason`): it is refused once the case ended


def waiting_of(summary: Mapping[str, Any], row: CaseRow | None) -> dict[str, str] | None:
    """Where a case no process here runs waits for signals now, as its row last recorded it: each signal it waits
    for -> the node path of the wait that holds it (the row's `at` among the summary's waits of that signal).
    None where the row cannot say: no row, or a case running now (its row is from before it ran)."""
    if row is None or row.state in (CaseState.RUNNING.value, CaseState.INITIALIZING.value):
        return None
    waits = summary.get("waits") or {}
    waiting = {}
    for name in row.signals:
        paths = list(waits.get(name) or ())
        here = [path for path in row.at if path in paths]
        waiting[name] = here[0] if here else (paths[0] if paths else str(summary.get("root", "?")))
    return waiting


def against_summary(
    msg: External, summary: Mapping[str, Any], case_id: str, models: Mapping[str, type] | None = None,
    row: CaseRow | None = None,
) -> None:
    """The owner's refusal of an input, made from the program summary of the case's version (see the module):
    an unknown signal or region, or a payload that does not fit its model. `models`: the version's own payload
    models when this process has the program registered (a standby): the payload is then checked by the model
    itself, exactly as the owner will; otherwise against its JSON Schema. `row`: the case's row, so a refusal
    says where the case waits now (`waiting_of`), as the owner's does."""
    root = str(summary.get("root", ""))
    if type(msg) is Signal:
        assert isinstance(msg, Signal)
        signals = summary.get("signals") or {}
        waits = summary.get("waits") or {}  # (a summary written before it listed them has none)
        updates = summary.get("updates")
        if msg.update and updates is not None and msg.name not in updates:
            raise SignalRejected.not_an_update(case_id, msg.name, updates, signals)
        waiting = waiting_of(summary, row)
        if msg.name not in signals:
            known = {name: list(waits.get(name) or ["?"]) for name in signals}
            raise SignalRejected.unknown_signal(case_id, msg.name, known, waiting)
        paths = list(waits.get(msg.name) or [root])
        model = (models or {}).get(msg.name)
        if model is not None:
            try:
                model.model_validate(msg.payload)  # type: ignore[attr-defined]
            except ValidationError as exc:
                raise SignalRejected.invalid_payload(
                    case_id, msg.name, model, exc.errors(include_url=False), paths, waiting
                ) from None
            return
        schema = signals[msg.name]
        if isinstance(schema, Mapping):
            errors = payload_errors(schema, msg.payload, names=summary_names(summary))
            if errors:
                named = type(model_name(schema), (), {})
                raise SignalRejected.invalid_payload(case_id, msg.name, named, errors, paths, waiting)
    elif type(msg) is RegionOp:
        assert isinstance(msg, RegionOp)
        regions = summary.get("regions") or {}
        if msg.name not in regions:
            action = msg.action.value
            raise SignalRejected.unknown_region(case_id, f"{action} {msg.name!r}", msg.name, regions, root)
    # a cancel needs nothing of the program: it is refused only once the case has ended


def inbox_body(msg: External, limit: int | None) -> dict[str, Any]:
    """What goes to the store's inbox for a case on another node (JSON, within `limit`)."""
    if type(msg) is Signal:
        assert isinstance(msg, Signal)
        payload, _ = as_journaled(plain(msg.payload), f"signal {msg.name!r} payload", limit)
        return {"name": msg.name, "payload": payload}
    if type(msg) is Cancel:
        assert isinstance(msg, Cancel)
        bounded_reason(msg, limit)
        return {"reason": msg.reason, "compensate": msg.compensate}
    assert isinstance(msg, RegionOp)
    if msg.items is None:
        return {"region": msg.name}
    listed, _ = as_journaled(msg.items, f"add_instances({msg.name!r}) items", limit)
    return {"region": msg.name, "items": listed}


def kind_of(msg: External) -> str:
    """The inbox and journal kind of a message."""
    if type(msg) is Signal:
        assert isinstance(msg, Signal)
        return "update" if msg.update else "signal"
    if type(msg) is Cancel:
        return "cancel"
    assert isinstance(msg, RegionOp)
    return msg.action.kind


def check_input(kind: str, body: Mapping[str, Any], *, request_id: str | None = None) -> dict[str, Any]:
    """Check an input for a durable case as its owner will, before anything is sent (`wfsub.lowlevel`).

    `kind` is one of `signal`, `update`, `cancel`, `cancel_region`, `complete_region`, `add_instances`,
    `close_instances`; `body` its fields (see `Store.inbox_put`). Returns the body as the owner will take it
    (defaults filled in); raises TypeError or ValueError naming the field and the fix. What depends on the case
    (its signals and regions, whether it has ended) is checked by its owner."""
    return inbox_body(shaped(kind, body, request_id), None)


def start_data(
    data: object, model: type[BaseModel] | None = None, workflow: str | None = None, case_id: str | None = None
) -> dict[str, Any] | None:
    """The data a case starts with: a mapping with str keys (a pydantic model is dumped), or None.

    `model`: the input model its workflow was registered with (`Workflow(term, input=Model)`): the data must
    validate against it (None counts as `{}`), else `InvalidStartData` with pydantic's errors; the case starts
    with the model's JSON-mode dump."""
    if isinstance(data, Mapping):
        shallow(data, f"the data of new_case({workflow!r})" if workflow else "the case's start data", case_id)
    if model is not None:
        given = data.model_dump(mode="json") if isinstance(data, BaseModel) else {} if data is None else data
        try:
            checked = model.model_validate(given)
        except ValidationError as exc:
            raise InvalidStartData(workflow or "?", model, exc.errors(include_url=False), case_id) from None
        return checked.model_dump(mode="json")
    if data is None:
        return None
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    if not isinstance(data, Mapping):
        raise TypeError(
            f"case data must be a mapping (a dict with str keys) or a pydantic model, got {type(data).__name__}; "
            f"pass e.g. new_case(workflow, {{'order_id': 42}})"
        )
    for key in data:
        if not isinstance(key, str):
            raise TypeError(
                f"case data keys must be str (steps read them as ctx[key]), got {type(key).__name__} {key!r}"
            )
    return dict(data)


def start_against_summary(
    data: dict[str, Any] | None, summary: Mapping[str, Any], workflow: str, case_id: str | None
) -> None:
    """A start checked against the input model its version was registered with, from the program summary's JSON
    Schema (for a process that does not have the workflow registered: a `wfsub.Client`): InvalidStartData with
    the errors pydantic would give, as the owner's `start_data` refuses it."""
    schema = summary.get("input")
    if not isinstance(schema, Mapping):
        return
    errors = payload_errors(schema, {} if data is None else data, names=summary_names(summary))
    if errors:
        raise InvalidStartData(workflow, type(model_name(schema), (), {}), errors, case_id)


MAX_TAGS = 16
"""The most tags a case may carry."""

MAX_TAG_KEY = 100
MAX_TAG_VALUE = 500
"""The longest tag key and value, in characters."""


def tags(value: object, case_id: str | None = None) -> dict[str, str]:
    """The tags of `new_case(..., tags=)` (and `cases(tags=)`): a dict of str to str, at most `MAX_TAGS`, keys
    non-empty; each from every door (API, client, standby, command) before anything is written."""
    if value is None:
        return {}
    fix = "pass a dict of str to str, e.g. tags={'customer': 'c-17'}"
    if not isinstance(value, Mapping):
        raise bad_input("tags must be a dict of str to str", value, case_id=case_id, fix=fix)
    if len(value) > MAX_TAGS:
        raise bad_input(f"a case takes at most {MAX_TAGS} tags, {len(value)} were given", NOTHING, case_id=case_id,
                        error=ValueError, fix="keep the tags you search by; put the rest in the case's data")
    checked: dict[str, str] = {}
    for key, tag in value.items():
        if not isinstance(key, str) or not key:
            raise bad_input("tag keys must be non-empty str", key, case_id=case_id, fix=fix)
        if not isinstance(tag, str):
            raise bad_input(f"tag {key!r}: tag values must be str", tag, case_id=case_id,
                            fix=f"pass the value as text, e.g. tags={{{key!r}: str(value)}}")
        if len(key) > MAX_TAG_KEY or len(tag) > MAX_TAG_VALUE:
            raise bad_input(f"tag {key[:40]!r}: a key has at most {MAX_TAG_KEY} characters and a value at most "
                            f"{MAX_TAG_VALUE}", NOTHING, case_id=case_id, error=ValueError,
                            fix="tags are short keys to find cases by; keep long text in the case's data")
        checked[key] = tag
    return checked


def listing(
    *, limit: object, before: object, tags_given: object, id_prefix: object, started_after: object,
    started_before: object,
) -> dict[str, Any]:
    """The filters of `cases()` beyond state and workflow, checked (a ValueError or TypeError naming the filter)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise bad_input("cases(): limit must be an int >= 1", limit, error=ValueError, fix="e.g. limit=100")
    if before is not None and (isinstance(before, bool) or not isinstance(before, int) or before < 1):
        raise bad_input("cases(): before must be the `order` of a case of the previous page (an int >= 1)", before,
                        error=ValueError, fix="pass page[-1].order")
    if id_prefix is not None and (not isinstance(id_prefix, str) or not id_prefix):
        raise bad_input("cases(): id_prefix must be a non-empty str", id_prefix,
                        fix="pass the start of the case ids to list, e.g. id_prefix='order-'")
    for name, when in (("started_after", started_after), ("started_before", started_before)):
        if when is not None and (isinstance(when, bool) or not isinstance(when, int | float)
                                 or when != when or when in (float("inf"), float("-inf"))):
            raise bad_input(f"cases(): {name} must be a time in seconds (the clock's, e.g. time.time())", when,
                            fix=f"e.g. {name}=time.time() - 3600")
    return {"tags": tags(tags_given), "id_prefix": id_prefix, "started_after": started_after,
            "started_before": started_before}


def journal_part(records: list[Any], newest: object) -> list[Any]:
    """The records `journal(case_id, newest=)` returns: every one (None), or the start and the newest `newest`
    (an int >= 0) after it."""
    if newest is None:
        return records
    if isinstance(newest, bool) or not isinstance(newest, int) or newest < 0:
        raise bad_input("journal(): newest must be an int >= 0 (or None for every record)", newest,
                        error=ValueError, fix="e.g. newest=500: the start record and the newest 500")
    if len(records) <= newest + 1:
        return records
    return [records[0], *records[len(records) - newest:]]


LIFECYCLE_KINDS = ("retry", "fork")
"""Inbox kinds that are not inputs of a case but asks of its owner: `retry` (body {}) and `fork` (body {"at": seq,
"new_case_id": id or None}); the owner does them as `Substrate.retry` and `Substrate.fork` do."""


def fork_body(at: object, new_case_id: object, case_id: str | None = None) -> dict[str, Any]:
    """The arguments of a fork, checked: `at` an int seq >= 0, `new_case_id` None or a visible str."""
    if isinstance(at, bool) or not isinstance(at, int) or at < 0:
        raise bad_input("fork: at must be the seq of a record of the case (an int >= 0)", at, case_id=case_id,
                        fix="pass the seq of a record its journal lists (`journal()`, or `wfsub journal`)")
    if new_case_id is not None and (
        not isinstance(new_case_id, str) or not new_case_id or new_case_id != new_case_id.strip()
    ):
        raise bad_input("fork: new_case_id must be a non-empty str without leading or trailing spaces (or None)",
                        new_case_id, case_id=case_id, fix="pass a visible id, or omit it to get a fresh one")
    return {"at": at, "new_case_id": new_case_id}



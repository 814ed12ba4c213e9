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

Ids are checked here too, once per door. `check_case_id` is the only check of a case id: of a new case's (a
non-empty str of visible characters, at most `MAX_CASE_ID_BYTES` of UTF-8: what every store can index) wherever
one is made (`new_case`, `fork`, a `start_case` child, a schedule's slot), and of an id to look up (only what no
store could hold: a NUL, a lone surrogate) wherever one is read. `request_id` bounds request ids the same way, and
`derived_request_id` keeps the ones wfsub builds from case ids within that bound.

Refusals are made by the builders in `wfsub._errors` (`bad_input`, `SignalRejected`), so a refusal reads the
same from every door. `start` (the data of `new_case`) is checked by `start_data` here too, against the input
model its workflow was registered with (`Workflow(term, input=Model)`), whichever door starts the case.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from .._errors import NOTHING, InvalidStartData, SignalRejected, bad_input, too_deep
from .._json import MAX_DEPTH, json_problem, loads_long
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
    not with RecursionError, and an int too long for case data (`_json.int_digits`) as ValueError naming where it is.
    Text that is not JSON raises `json.JSONDecodeError` (a ValueError) as it does."""
    try:
        value, long = loads_long(text)
    except RecursionError:
        raise too_deep(what, MAX_DEPTH, case_id=case_id) from None
    problem = json_problem(value, what) if long else None
    if problem is not None:
        raise ValueError(problem)
    return value


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


MAX_CASE_ID_BYTES = 1000
"""The longest case id, in bytes of UTF-8 (1,000 ASCII characters; fewer of other scripts).

Every store indexes case ids, and Postgres refuses a btree entry longer than 2,704 bytes (a third of a page). Its
widest entries hold a case id and a request id together (`journal (case_id, request_id)`), and the request ids
wfsub makes itself name cases (`{parent}:{effect id}:{path}`): 1,000 bytes of case id and `MAX_REQUEST_ID_BYTES`
of request id fit in one entry with room to spare, and a case id fits in the NOTIFY payload (at most 8,000 bytes)
that tells every node a case changed. SQLite and memory have no such bound; the same one holds on every store, so
a case that starts on one starts on any."""

MAX_REQUEST_ID_BYTES = 1500
"""The longest request id, in bytes of UTF-8: a request id is indexed beside its case's id (`MAX_CASE_ID_BYTES`).
A request id wfsub derives from case ids and node paths (`derived_request_id`) that would be longer is replaced by
a digest of itself."""

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # a NUL, or half of a surrogate pair: no store keeps either
# Unicode's control characters (Cc), its line and paragraph separators (line breaks too), and the above
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMES = {"\x00": "a NUL character", "\t": "a tab", "\n": "a line break", "\r": "a carriage return",
          "\u2028": "a line separator (U+2028, a line break)", "\u2029": "a paragraph separator (U+2029, a line break)"}
_UNSEEN = ("Cf", "Zs", "Zl", "Zp", "Mn", "Me")  # categories that show nothing by themselves (format, spaces, marks)

NEW_ID_FIX = ("pass an id of visible characters (letters, digits, '-', '_', ':', '/', '@', spaces inside), at most "
              f"{MAX_CASE_ID_BYTES:,} bytes of UTF-8, or omit it to get a fresh one")


def shown(text: str, limit: int = 60) -> str:
    """`text` as its repr, shortened past `limit` characters (an id of a megabyte is not printed whole)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def check_case_id(value: object, what: str = "case_id", *, new: bool = True, fix: str = NEW_ID_FIX) -> str:
    """A case id, checked at every door it comes through (the API, a Client, the command, the web inspector, a
    `start_case` step, a schedule); returns it as given.

    `new`: the id of a case about to be created (`new_case`, `fork(new_case_id=)`, a child's id): a non-empty str
    with no leading or trailing space, no control character (NUL, tab, line break, ... : Unicode's category Cc,
    and its line and paragraph separators U+2028, U+2029), some character that shows (not only format characters
    such as a zero-width space, spaces or combining marks: an id no listing would show), valid Unicode (no lone
    surrogate) and at most `MAX_CASE_ID_BYTES` bytes of UTF-8. Otherwise the id of a case
    to find (`status`, `signal`, `handle`, ...): only a str that no store could hold is refused (a NUL, a lone
    surrogate), since a store written by an older wfsub may hold ids the rules for new ones now refuse.
    `what` names the id in the message (`"case_id"`, `"the child's case id of start_case('x') at seq[0] ..."`);
    `fix` says what to do instead. TypeError for a value that is not a str, else ValueError."""
    if type(value) is not str:
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str, got {type(value).__name__} {value!r}: {fix}")
        value = str(value)  # (a subclass of str: stored and compared as the plain str it holds)
    if not new:
        if value.isascii() and "\x00" not in value:  # (the common case, on every lookup)
            return value
        found = _UNSTORABLE.search(value)
        if found is not None:
            raise ValueError(_unfit(value, what, found, "no store keeps it, so no case has this id",
                                    "check where the id came from (a NUL is %00 in an address)"))
        return value
    found = _CONTROL.search(value)
    if found is not None:
        raise ValueError(_unfit(value, what, found, "which no case id may hold", fix))
    if not value or value != value.strip():
        raise ValueError(f"{what} is empty or has leading or trailing spaces ({shown(value)}): {fix}")
    if not value.isascii() and all(unicodedata.category(c) in _UNSEEN for c in value):
        raise ValueError(f"{what} has no visible character ({shown(value)}: format characters, spaces or marks "
                         f"only, as a zero-width space): {fix}")
    size = len(value) if value.isascii() else len(value.encode("utf-8"))
    if size > MAX_CASE_ID_BYTES:
        raise ValueError(
            f"{what} is {size:,} bytes of UTF-8 ({shown(value)}), more than the {MAX_CASE_ID_BYTES:,} a case id may "
            f"have (every store indexes case ids): {fix}"
        )
    return value


def _unfit(value: str, what: str, found: re.Match[str], why: str, fix: str) -> str:
    char = found.group()
    name = _NAMES.get(char) or (
        f"half of a surrogate pair (U+{ord(char):04X}: not valid Unicode)" if "\ud800" <= char <= "\udfff"
        else f"a control character (U+{ord(char):04X})"
    )
    return f"{what} holds {name} at index {found.start()} ({shown(value)}), {why}: {fix}"


def request_id(value: object, case_id: str | None = None) -> str | None:
    """A request id: None, or a non-empty str that every store keeps and indexes beside its case's id
    (`stored_key`: no NUL, at most `MAX_REQUEST_ID_BYTES` bytes of UTF-8)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise bad_input("request_id must be a non-empty str (or None)", value, case_id=case_id,
                        fix="pass the same id when you retry a call, so it applies once")
    return stored_key(value, "request_id", MAX_REQUEST_ID_BYTES, case_id)


def stored_key(value: str, what: str, limit: int, case_id: str | None = None) -> str:
    """`value`, a key a store indexes (a request id, a queue's dedup or partition key), if every store can: no NUL
    and no lone surrogate (neither is text Postgres keeps), at most `limit` bytes of UTF-8 (what its index
    takes); else ValueError naming `what`."""
    if not value.isascii() or "\x00" in value:
        found = _UNSTORABLE.search(value)
        if found is not None:
            where = "" if case_id is None else f" (an input for case {case_id!r})"
            raise ValueError(_unfit(value, what, found, f"which no store keeps{where}",
                                    "use printable text, e.g. a UUID or 'order-42-approve'"))
    size = len(value) if value.isascii() else len(value.encode("utf-8"))
    if size > limit:
        raise bad_input(
            f"{what} is {size:,} bytes of UTF-8 ({shown(value)}), more than the {limit:,} it may have, as every "
            "store indexes it", NOTHING, case_id=case_id, error=ValueError,
            fix="use a short key, e.g. a UUID, or a digest of a long one (hashlib.sha256(text).hexdigest())",
        )
    return value


def derived_request_id(text: str) -> str:
    """A request id wfsub makes from case ids and node paths (`signal_case`'s `{case id}:{effect id}:{path}`, the
    cancel of a child): `text` itself, or, past `MAX_REQUEST_ID_BYTES`, `sha256:` and the hex digest of its UTF-8
    (deterministic, so every attempt, replay and node derives the same one)."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= MAX_REQUEST_ID_BYTES:
        return text
    return "sha256:" + hashlib.sha256(data).hexdigest()


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
    if isinstance(payload, list | tuple | dict):  # (a container is walked; a scalar costs one type check)
        shallow(payload, f"the payload of signal {name!r}", case_id)
    return Signal(name, payload, reply, 0, rid)


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
    back); None for a case in memory only (nothing is converted). A signal comes first: it is the signal round
    trip's hot path."""
    if type(msg) is Signal:
        payload = machine.check_update(msg.name, msg.payload) if msg.update else machine.check_signal(msg.name,
                                                                                                       msg.payload)
        if limit is not None:
            payload, _ = as_journaled(payload, f"signal {msg.name!r} payload", limit)
        msg.payload = payload
    elif type(msg) is RegionOp:
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
        try:
            _signal_against_summary(msg, summary, case_id, models, row, root)
        except SignalRejected as exc:  # an update's refusal says update, as the owner's does (`check_update`)
            raise (SignalRejected.as_update(exc, msg.name) if msg.update else exc) from None
    elif type(msg) is RegionOp:
        assert isinstance(msg, RegionOp)
        regions = summary.get("regions") or {}
        if msg.name not in regions:
            action = msg.action.value
            raise SignalRejected.unknown_region(case_id, f"{action} {msg.name!r}", msg.name, regions, root)
    # a cancel needs nothing of the program: it is refused only once the case has ended


def _signal_against_summary(
    msg: Signal, summary: Mapping[str, Any], case_id: str, models: Mapping[str, type] | None, row: CaseRow | None,
    root: str,
) -> None:
    """`against_summary` for a signal or an update: refused as a signal (the caller says update for an update)."""
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


def inbox_body(msg: External, limit: int | None, case_id: str | None = None) -> dict[str, Any]:
    """What goes to the store's inbox for case `case_id` on another node (JSON, within `limit`)."""
    if type(msg) is Signal:
        assert isinstance(msg, Signal)
        payload, _ = as_journaled(plain(msg.payload), f"signal {msg.name!r} payload", limit)
        return {"name": msg.name, "payload": payload}
    if type(msg) is Cancel:
        assert isinstance(msg, Cancel)
        bounded_reason(msg, limit, case_id)
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


def check_input(
    kind: str, body: Mapping[str, Any], *, request_id: str | None = None, case_id: str | None = None
) -> dict[str, Any]:
    """Check an input for a durable case as its owner will, before anything is sent (`wfsub.lowlevel`).

    `kind` is one of `signal`, `update`, `cancel`, `cancel_region`, `complete_region`, `add_instances`,
    `close_instances`; `body` its fields (see `Store.inbox_put`). Returns the body as the owner will take it
    (defaults filled in); raises TypeError or ValueError naming the field and the fix. What depends on the case
    (its signals and regions, whether it has ended) is checked by its owner. `case_id`: the case it is for, named
    in a refusal as every door names it."""
    return inbox_body(shaped(kind, body, request_id, case_id=case_id), None, case_id)


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
    started_before: object, parent: object = None,
) -> dict[str, Any]:
    """The filters of `cases()` beyond state and workflow, checked (a ValueError or TypeError naming the filter)."""
    if parent is not None:
        if parent == "":
            raise ValueError("cases(): parent must be a case id (a non-empty str) or None, got '': pass the id of the "
                             "case whose children to list")
        parent = check_case_id(parent, "cases(): parent", new=False)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise bad_input("cases(): limit must be an int >= 1", limit, error=ValueError, fix="e.g. limit=100")
    if before is not None and (isinstance(before, bool) or not isinstance(before, int) or before < 1):
        raise bad_input("cases(): before must be the `order` of a case of the previous page (an int >= 1)", before,
                        error=ValueError, fix="pass page[-1].order")
    if id_prefix is not None and (not isinstance(id_prefix, str) or not id_prefix):
        raise bad_input("cases(): id_prefix must be a non-empty str", id_prefix,
                        fix="pass the start of the case ids to list, e.g. id_prefix='order-'")
    if id_prefix is not None:
        check_case_id(id_prefix, "cases(): id_prefix", new=False)
    for name, when in (("started_after", started_after), ("started_before", started_before)):
        if when is not None and (isinstance(when, bool) or not isinstance(when, int | float)
                                 or when != when or when in (float("inf"), float("-inf"))):
            raise bad_input(f"cases(): {name} must be a time in seconds (the clock's, e.g. time.time())", when,
                            fix=f"e.g. {name}=time.time() - 3600")
    return {"tags": tags(tags_given), "id_prefix": id_prefix, "started_after": started_after,
            "started_before": started_before, "parent": parent}


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


LIFECYCLE_KINDS = ("retry", "fork", "backfill")
"""Inbox kinds that are not inputs of a case but asks of its owner: `retry` (body {}) and `fork` (body {"at": seq,
"new_case_id": id or None}); the owner does them as `Substrate.retry` and `Substrate.fork` do; and `backfill` of a
schedule (body {"schedule": name, "start": seconds, "end": seconds}; its case id is the first slot's case's), as
`Substrate.backfill_schedule` does."""


def fork_body(at: object, new_case_id: object, case_id: str | None = None) -> dict[str, Any]:
    """The arguments of a fork, checked: `at` an int seq >= 0, `new_case_id` None or a new case's id (`case_id`)."""
    if isinstance(at, bool) or not isinstance(at, int) or at < 0:
        raise bad_input("fork: at must be the seq of a record of the case (an int >= 0)", at, case_id=case_id,
                        fix="pass the seq of a record its journal lists (`journal()`, or `wfsub journal`)")
    if new_case_id is not None:
        where = "fork" if case_id is None else f"fork of case {shown(case_id)}"
        new_case_id = check_case_id(new_case_id, f"{where}: new_case_id")
    return {"at": at, "new_case_id": new_case_id}



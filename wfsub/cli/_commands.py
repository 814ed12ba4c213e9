"""The `wfsub` commands. Each opens what it needs, does one thing, and exits 0 (done), 1 (an error, or a
replay that diverged) or 2 (a usage error); errors go to stderr with the fix in the message."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from functools import wraps
from types import ModuleType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import anyio
import click

from .. import InvalidWorkflow, ReplayDivergence, WfsubError
from ._targets import CliError, Target, _store_for_cli, case_row, load_redact, load_target, opened

# What a command needs (the runtime, the stores, the compiler, Rich) is imported by the command when it runs,
# so `wfsub --help` and a mistyped command load none of it.
if TYPE_CHECKING:
    from rich.progress import Progress

    from ..stores import CaseRow, Owner, Store
    from . import _render as r


def _lazy_module(name: str) -> ModuleType:
    """The module `name`, imported on the first use of one of its attributes (importlib.util.LazyLoader)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None, name
    assert spec.loader is not None, name
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module


if not TYPE_CHECKING:
    r = _lazy_module("wfsub.cli._render")  # Rich's consoles and tables: loaded by the first command that prints

P = ParamSpec("P")
T = TypeVar("T")

STORE = click.argument("store", metavar="STORE")  # a path or URL, as for Substrate(store=...)
WORKFLOW = click.option(
    "--workflow", "-w", "workflow", required=True, envvar="WFSUB_WORKFLOW", show_envvar=True,
    metavar="MODULE:ATTR", help="The workflow term, or the dict of name -> term given to Substrate(workflows=).",
)
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
WAIT_POLL = 0.05  # seconds between looks at the inbox row of an input while waiting for the owner


def _case_ids(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A case id given to a command (CASE_ID, --parent, --id-prefix; --id of a fork is a new case's), checked as
    every door checks one (`wfsub.lowlevel.check_case_id`) before the store is opened: a usage error (status 2)."""
    if value is None:
        return value
    from ..lowlevel import check_case_id

    new = param.name == "new_case_id"
    what = f"the new case id ({'/'.join(param.opts)})" if new else (
        param.human_readable_name if isinstance(param, click.Argument) else "/".join(param.opts))
    try:
        for one in value if isinstance(value, tuple) else (value,):
            check_case_id(one, what, new=new)
    except (TypeError, ValueError) as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


CASE_ID = click.argument("case_id", callback=_case_ids)


class _StateChoice(click.Choice[str]):
    """A choice of the case states (`CaseState` values), read from the runtime on first use (a command's own
    `--help` or its arguments), not when `wfsub` starts."""

    def __init__(self) -> None:
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        from .. import CaseState

        return tuple(s.value for s in CaseState)


def _run(fn: Callable[P, Awaitable[T]]) -> Callable[P, T]:
    """Run an async command body; wfsub's own errors become `Error: ...` on stderr with exit status 1."""

    @wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        async def body() -> T:
            return await fn(*args, **kwargs)

        try:
            return anyio.run(body)
        except WfsubError as exc:
            raise CliError(str(exc)) from exc

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="wfsub", prog_name="wfsub")
def main() -> None:
    """See and steer wfsub cases in a store, and look at workflows.

    Store commands take STORE (a SQLite file path, sqlite:///path or postgresql://..., as for
    Substrate(store=...)) and work beside the running Substrate that owns it: they read what it recorded and
    post inputs to its inbox. Workflow commands take MODULE:ATTR, imported with the current directory first on
    the path (as uvicorn does).
    """


# -- reading a store ------------------------------------------------------------------------------------------


@main.command()
@STORE
@click.option("--state", type=_StateChoice(), help="Only cases in this state.")
@click.option("--workflow", "-w", "workflow", metavar="NAME", help="Only cases of this registered workflow.")
@click.option("--limit", "-n", type=click.IntRange(min=1), default=50, show_default=True, help="Cases per page.")
@click.option("--before", type=click.IntRange(min=1), metavar="ORDER", help="The page after a case's order.")
@click.option("--tag", "tag_pairs", multiple=True, metavar="KEY=VALUE",
              help="Only cases tagged so (repeat: every tag must match).")
@click.option("--id-prefix", metavar="TEXT", callback=_case_ids, help="Only cases whose id starts with this.")
@click.option("--parent", metavar="CASE", callback=_case_ids,
              help="Only the child cases this case started (start_case).")
@AS_JSON
@_run
async def cases(store: str, state: str | None, workflow: str | None, limit: int, before: int | None,
                tag_pairs: tuple[str, ...], id_prefix: str | None, parent: str | None, as_json: bool) -> None:
    """List cases, newest first."""
    from ..stores import Listing

    if state == "queued":  # (cases waiting in a queue have no row yet: their queue items)
        async with opened(store) as s:
            items = [i for i in s.read_queue_items(state="queued", limit=limit)
                     if workflow is None or i.start.get("workflow") == workflow]
        listed = [{"case_id": i.case_id, "workflow": i.start.get("workflow"), "state": "queued", "queue": i.queue,
                   "priority": i.priority, "dedup": i.dedup, "partition": i.partition,
                   "enqueued_at": i.enqueued_at, "enqueued_at_iso": r.iso(i.enqueued_at)} for i in items]
        if as_json:
            for item in listed:
                r.print_json(item)
        elif listed:
            r.print_table(r.queued_table(listed))
        else:
            r.err.print("no queued cases")
        return
    tags = _tags(tag_pairs)
    async with opened(store) as s:
        rows = await s.cases(Listing(state, workflow, limit, before, tags, id_prefix or None, parent=parent))
    if as_json:
        for row in rows:
            r.print_json(_row_json(row))
    elif rows:
        r.print_table(r.cases_table(rows))
    else:
        filtered = state or workflow or before or tags or id_prefix or parent
        r.err.print("no cases" + (" match" if filtered else " in the store"))
    if len(rows) == limit:
        r.err.print(f"there may be more: add --before {rows[-1].order} for the next page", style="dim")


@main.command()
@STORE
@AS_JSON
@_run
async def schedules(store: str, as_json: bool) -> None:
    """List the schedules the store knows, each with its last and next slot."""
    from .. import Schedule

    async with opened(store) as s:
        rows = await s.schedules()
    now = time.time()
    listed = []
    for row in rows:
        spec = row.spec
        last = row.last_slot
        period = Schedule(row.name, spec["workflow"], cron=spec.get("cron"), every=spec.get("every"),
                          tz=spec.get("tz") or "UTC")
        upcoming = period.next_after(now if last is None else max(now, last))
        listed.append({
            "name": row.name, "workflow": spec.get("workflow"), "cron": spec.get("cron"),
            "every": spec.get("every"), "tz": spec.get("tz"), "paused": row.paused,
            "last_slot": r.iso(last) if last is not None else None, "last_case": row.last_case,
            "next_slot": r.iso(upcoming),
        })
    if as_json:
        for item in listed:
            r.print_json(item)
    elif listed:
        r.print_table(r.schedules_table(listed))
    else:
        r.err.print("no schedules in the store")


@main.command()
@STORE
@CASE_ID
@AS_JSON
@_run
async def show(store: str, case_id: str, as_json: bool) -> None:
    """Where a case is: state, threads, what it waits for, its error."""
    from ..lowlevel import status_of
    from ..stores import Listing

    async with opened(store) as s:
        item = s.read_queue_item(case_id)
        if item is not None and item.state in ("queued", "cancelled") and await s.row(case_id) is None:
            shown_item: dict[str, Any] = {
                "case_id": item.case_id, "workflow": item.start.get("workflow"),
                "state": "cancelled" if item.state == "cancelled" else "queued", "queue": item.queue,
                "priority": item.priority, "dedup": item.dedup, "partition": item.partition,
                "enqueued_at": item.enqueued_at, "not_before": item.not_before,
            }
            if as_json:
                r.print_json(r.with_iso(shown_item, "enqueued_at", "not_before"), indent=2)
            else:
                for key, value in shown_item.items():
                    shown_value = r.when(value) if key in ("enqueued_at", "not_before") else value
                    r.out.print(f"{key:<12} {'-' if shown_value is None else shown_value}")
            return
        row = await case_row(s, case_id)
        ended_badly = row.state in ("cancelled", "failed")
        records = await s.journal(case_id) if ended_badly else []
        version = await s.program(row.fingerprint) if ended_badly else None
        summary = version.summary if version is not None else None
        run_by = None if row.state in ("done", "failed", "cancelled") else await _run_by(s, row)
        children = await s.cases(Listing(limit=_CHILDREN_SHOWN, parent=case_id))
    status = status_of(row, lambda v: v).model_copy(update={"children": tuple(c.case_id for c in reversed(children))})
    end = records[-1] if records and records[-1].get("kind") == "end" else {}
    named = status.failure.compensated if status.failure is not None else tuple(end.get("compensated") or ())
    ran = _compensations(records, named, _compensation_paths(summary))
    cancels = [rec for rec in records if rec.get("kind") == "cancel"]
    if status.cancel_reason is None and cancels:  # a cancel whose compensation failed ended the case failed
        status = status.model_copy(update={"cancel_reason": cancels[-1].get("reason")})
    if as_json:
        shown = status.model_dump(mode="json") | {"fingerprint": row.fingerprint, "last_seq": row.last_seq,
                                                  "compensations": ran, "run_by": run_by}
        shown["timers"] = [r.with_iso(t, "due") for t in shown["timers"]]
        shown["effects"] = [r.with_iso(e, "started_at", "retry_at") for e in shown["effects"]]
        shown["refused"] = [r.with_iso(x, "time") for x in shown["refused"]]
        r.print_json(r.with_iso(shown, "started_at", "ended_at"), indent=2)
        return
    r.print_table(r.status_table(status, row, ran, run_by))


async def _run_by(store: Store, row: CaseRow) -> str:
    """Who runs a case that has not ended, for people: the store's owner (a single-node store) or the node that
    owns the case (a shared store) and whether it runs now; a case nobody runs waits for a Substrate to open the
    store (its row says what it did last, not that something is doing it)."""
    if not store.shared:
        owner = await store.owner()
        if owner is None:
            return "no Substrate has the store open now: the case goes on when one opens it"
        return f"the Substrate {_owner(owner)}"
    nodes = getattr(store, "nodes", None)
    live = {node.owner_id: node for node in await nodes()} if nodes is not None else {}
    if row.owner is None:
        return "no node yet: the first node that runs its workflow version takes it"
    if row.owner in live:
        return f"node {_owner(live[row.owner])}"
    if live:
        return f"node {row.owner!r}, whose lease has lapsed: a live node takes the case over"
    return f"node {row.owner!r}; no node runs now: the case goes on when one opens the store"


def _compensation_paths(summary: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Each compensation of the case's version -> where it starts, from the version's program summary ({}: no
    summary, or one written before summaries listed compensations)."""
    listed = summary.get("compensations") if summary is not None else None
    return dict(listed) if isinstance(listed, dict) else {}


_CHILDREN_SHOWN = 1000  # (as `status().children` shows; `wfsub cases --parent` pages through them all)

_COMPENSATION = re.compile(r"\[\d+\.compensation\]")


def _compensations(
    records: list[dict[str, Any]], compensated: tuple[str, ...], paths: dict[str, list[str]]
) -> list[dict[str, Any]]:
    """The compensations a case's end ran, with their outcomes: each compensating effect the journal recorded
    (done, or failed with its error), each step its end names as compensated that was no effect, and each
    compensation its end's CompensationFailed lists as failed. `paths`: each compensation's name -> where it
    starts (from the program summary), for the steps the end names without a path."""
    ran: list[dict[str, Any]] = []
    for rec in records:
        if rec.get("kind") == "effect" and _COMPENSATION.search(str(rec.get("path", ""))):
            error = rec.get("error")
            ran.append({
                "name": rec.get("name"), "path": rec.get("path"), "outcome": "failed" if error else "done",
                "error": f"{error.get('type')}: {error.get('message')}" if error else None,
            })
    named = {c["name"] for c in ran}
    for name in compensated:
        if name not in named:
            where = paths.get(name) or []
            ran.append({"name": name, "path": " or ".join(where) or None, "outcome": "done", "error": None})
    end = records[-1] if records and records[-1].get("kind") == "end" else {}
    record = (end.get("error") or {}).get("record") or {}
    by_path = {path: name for name, where in paths.items() for path in where}
    shown = {c["path"] for c in ran}
    for failure in record.get("failures") or ():
        path = str(failure.get("path"))
        start = next((p for p in sorted(by_path, key=len, reverse=True) if path.startswith(p)), None)
        if path in shown or start in shown:
            continue  # a compensating effect's own record said it already
        ran.append({
            "name": by_path.get(start or "", path), "path": path, "outcome": "failed",
            "error": f"{failure.get('type')}: {failure.get('message')}",
        })
    return ran


@main.command()
@STORE
@CASE_ID
@_run
async def data(store: str, case_id: str) -> None:
    """A case's data as JSON (as last recorded; the final data once it ended)."""
    async with opened(store) as s:
        row = await case_row(s, case_id)
    r.print_json(row.data or {}, indent=2)


@main.command()
@STORE
@CASE_ID
@_run
async def journal(store: str, case_id: str) -> None:
    """A case's journal, one JSON record per line."""
    async with opened(store) as s:
        await case_row(s, case_id)
        records = await s.journal(case_id)
    for record in records:
        r.print_json(r.with_iso(record, "time"))


@main.command()
@STORE
@WORKFLOW
@CASE_ID
@click.option("--level", type=click.Choice(["min", "full"]), default="full", show_default=True)
@click.option("--redact", "redact_spec", metavar="MODULE:ATTR",
              help="The app's redact= function: applied to each event's detail, as the Substrate does.")
@AS_JSON
@_run
async def trace(store: str, workflow: str, case_id: str, level: str, redact_spec: str | None, as_json: bool) -> None:
    """A case's trace, replayed from its journal on its workflow (no effect runs)."""
    from .. import replay

    target = load_target(workflow)
    redact = load_redact(redact_spec)
    async with opened(store) as s:
        row = await case_row(s, case_id)
        records = await s.journal(case_id)
    program, warning = target.program_for(row)
    if warning:
        r.err.print(f"note: {warning}", style="yellow")
    report = replay(program, records, trace_level=level)
    for event in report.events:
        event = event.model_copy(update={"detail": redact(event.detail)})
        if as_json:
            r.print_json(r.with_iso(event.model_dump(mode="json"), "time"))
        else:
            r.out.out(event.format(limit=None), highlight=False)  # every detail whole: nothing cut
    if report.divergence is not None:
        raise CliError(f"the replay diverged, so the trace stops there: {report.divergence}")


# -- steering a case ------------------------------------------------------------------------------------------


def _payload(value: str | None) -> Any:
    if value is None:
        return None
    from ..lowlevel import loads_input

    try:
        return loads_input(value, "the payload")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"{value!r} is not JSON ({exc.msg} at column {exc.colno}): quote text as a JSON string, e.g. "
            "'\"approved\"', or give an object such as '{\"ok\": true}'",
            param_hint="PAYLOAD",
        ) from exc
    except ValueError as exc:  # nested deeper than an input may be
        raise click.BadParameter(str(exc), param_hint="PAYLOAD") from None


@main.command()
@STORE
@CASE_ID
@click.argument("name")
@click.argument("payload", required=False)
@click.option("--request-id", help="Sending again with the same id applies the signal once.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the owning Substrate has recorded the signal (or refused it).")
@click.option("--timeout", "patience", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds to wait for the owner.")
@_run
async def signal(store: str, case_id: str, name: str, payload: str | None, request_id: str | None, wait: bool,
                 patience: float) -> None:
    """Send signal NAME with a JSON PAYLOAD to a case."""
    body = _checked("signal", {"name": name, "payload": _payload(payload)}, request_id, case_id)
    async with opened(store) as s:
        row = await _steerable(s, case_id, "signal", f"signal {name!r}", request_id)
        if row is not None:
            await _post(s, row, "signal", body, request_id, wait, patience, f"signal {name!r}")


@main.command()
@STORE
@CASE_ID
@click.argument("name")
@click.argument("payload", required=False)
@click.option("--request-id", help="Sending again with the same id applies the update once and prints its answer.")
@click.option("--timeout", "patience", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="Seconds to wait for the answer.")
@_run
async def update(store: str, case_id: str, name: str, payload: str | None, request_id: str | None,
                 patience: float) -> None:
    """Send update NAME with a JSON PAYLOAD to a case and print its answer (JSON)."""
    from .. import Client

    value = _payload(payload)
    _checked("update", {"name": name, "payload": value}, request_id, case_id)
    async with opened(store) as s:  # a store and a case that exist (a mistyped path is an error, not a new store)
        await case_row(s, case_id)
    async with Client(_store_for_cli(store)) as client:
        try:
            answer = await client.update(case_id, name, value, request_id=request_id, timeout=patience)
        except TimeoutError as exc:
            raise CliError(str(exc)) from exc
    r.print_json(answer)


@main.command()
@STORE
@CASE_ID
@click.option("--reason", default="cancelled", show_default=True,
              help="Recorded as the case's cancel reason (checked with the other inputs: a blank one is refused).")
@click.option("--region", metavar="NAME", help="Cancel only this region of the case (its scope or MI name).")
@click.option("--compensate/--no-compensate", default=True, show_default=True,
              help="Run the compensations of completed saga steps and undo handlers.")
@click.option("--request-id", help="Cancelling again with the same id applies once.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the owning Substrate has recorded the cancel (or refused it).")
@click.option("--timeout", "patience", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="Seconds to wait for the owner.")
@_run
async def cancel(store: str, case_id: str, reason: str, region: str | None, compensate: bool,
                 request_id: str | None, wait: bool, patience: float) -> None:
    """Cancel a case (or one region of it)."""
    if region is None:
        body = _checked("cancel", {"reason": reason, "compensate": compensate}, request_id, case_id)
    else:
        body = _checked("cancel_region", {"region": region}, request_id, case_id)
    from ..lowlevel import cancel_in_queue

    async with opened(store) as s:
        if region is None and await s.row(case_id) is None:
            now = await s.database_time() if s.shared else time.time()
            if await cancel_in_queue(s, case_id, reason, request_id, now):  # queued: it never starts
                r.out.print(f"case {case_id!r} was queued: cancelled, it will not start")
                return
        if region is None:
            row = await _steerable(s, case_id, "cancel", "cancel", request_id)
            if row is not None:
                await _post(s, row, "cancel", body, request_id, wait, patience, "cancel")
        else:
            row = await _steerable(s, case_id, "cancel_region", f"cancel region {region!r}", request_id)
            if row is not None:
                await _post(s, row, "cancel_region", body, request_id, wait, patience, f"cancel of region {region!r}")


def _checked(kind: str, body: dict[str, Any], request_id: str | None, case_id: str) -> dict[str, Any]:
    """The input as its case's owner will take it, checked before anything is opened or sent (refused as every
    door refuses it, naming the case)."""
    from ..lowlevel import check_input

    try:
        return check_input(kind, body, request_id=request_id, case_id=case_id)
    except (TypeError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None


async def _steerable(store: Store, case_id: str, kind: str, what: str, request_id: str | None) -> CaseRow | None:
    """The row of a case to send `what` (an input of `kind`) to; None when `request_id` is that of the `kind`
    input the case took (said so: a retried command answers as the first did, also when that input ended the
    case). A request id another kind of input used is refused: it names that input, not this one."""
    from .. import SignalRejected
    from ..lowlevel import not_found_or_queued, request_applied  # (a compacted journal's snapshot keeps the ids)

    action = f"take {what}" if kind == "signal" else what
    if await store.row(case_id) is None:  # (a case waiting in its queue has none yet: refused, saying so)
        refusal = not_found_or_queued(store, case_id, action)
        if isinstance(refusal, SignalRejected):
            raise _refused(case_id, what, str(refusal), "nothing was sent")
    row = await case_row(store, case_id)
    try:  # live or ended: a retry sends nothing (as a Client's does), rather than an inbox row its owner drops
        if await request_applied(store, case_id, request_id, kind, action):
            r.err.print(f"done: case {case_id!r} recorded the {what} (request id {request_id!r} was applied before)")
            return None
    except SignalRejected as exc:
        raise _refused(case_id, what, str(exc), "nothing was sent") from None
    return row  # (an ended case refuses it where it is sent, as every door refuses it: `_post`)


async def _post(store: Store, row: CaseRow, kind: str, body: dict[str, Any], request_id: str | None, wait: bool,
                patience: float, what: str) -> None:
    """Send an input to the case's owner through the inbox, checked as every door checks it (against the case's
    program summary too); with `wait`, follow it until the owner records or refuses it."""
    from .. import SignalRejected
    from ..lowlevel import send_input

    try:
        inbox_id = await send_input(store, row, kind, body, request_id)
    except (SignalRejected, ValueError) as exc:  # refused as the owner would refuse it, even while no owner runs
        raise _refused(row.case_id, what, str(exc), "nothing was sent") from None
    if not inbox_id:  # (applied meanwhile: `_steerable` said so to a retry that came first)
        r.err.print(f"done: case {row.case_id!r} recorded the {what} (request id {request_id!r} was applied before)")
        return
    owner = await store.owner()
    if owner is None:
        r.err.print(
            f"queued: no Substrate owns {store.url} now; the {what} is applied to case {row.case_id!r} when one "
            "opens the store"
        )
        return
    if not wait:
        r.err.print(f"sent: the {what} is in the inbox of {_owner(owner)}, which applies it while it runs")
        return
    recorded = False
    with anyio.move_on_after(patience) as scope:
        while not recorded:
            found = await store.inbox_row(inbox_id)
            if found is None:
                recorded = True
            elif found.refused is not None:
                raise _refused(row.case_id, what, found.refused, "the case is unchanged")
            else:
                await anyio.sleep(WAIT_POLL)
    if not recorded:
        raise CliError(
            f"the owner {_owner(owner)} did not take the {what} within {patience:g}s; it stays in the inbox and "
            "is applied when the owner takes it (check that that process is running and not stuck: its log says "
            "why; --timeout waits longer)"
        )
    then = await _what_followed(store, row.case_id, scope.deadline - anyio.current_time())
    r.err.print(f"done: case {row.case_id!r} recorded the {what}{then}")


def _refused(case_id: str, what: str, reason: str, then: str) -> CliError:
    """A refusal of an input as the command says it: the refusal's own text when it names the case (it says what
    could not be done and why), else `case ... refused the ...: reason`; then what became of the input."""
    said = reason if reason.startswith(f"case {case_id!r} ") else f"case {case_id!r} refused the {what}: {reason}"
    return CliError(f"{said}; {then}")


def _owner(owner: Owner) -> str:
    """Who owns a store, for people: its id, and its process and host where known."""
    where = " on ".join(part for part in (
        f"pid {owner.pid}" if owner.pid is not None else "", f"host {owner.host}" if owner.host else "",
    ) if part)
    return f"{owner.owner_id!r}" + (f" ({where})" if where else "")


async def _what_followed(store: Store, case_id: str, patience: float) -> str:
    """Once the owner recorded an input, follow the case (within what is left of `--timeout`) until its row says
    it waits again or ended: if it ended, what to add to the command's answer, and why (a region's cancel can take
    the whole case with it); "" if it goes on. The owner records the row when the case parks, ends, or has waited
    on effects for a tenth of a second, so this is short: the command never waits for a case's effects."""
    from .. import CaseState

    with anyio.move_on_after(max(patience, 0.0)):
        while True:
            row = await case_row(store, case_id)
            state = CaseState(row.state)
            if state is CaseState.DONE:
                return ", and the case went on to its end: it is done"
            if state.ended:
                why = row.cancel_reason or (row.error or {}).get("message") or "no reason recorded"
                return f", which ended the case: it is {state.value}: {why}"
            if state.parked or state in (CaseState.SUSPENDED, CaseState.WAITING_EFFECT):
                return ""  # it goes on: it waits again
            await anyio.sleep(WAIT_POLL)
    return ""


# -- replaying and pruning ------------------------------------------------------------------------------------


@main.command(name="replay")
@STORE
@WORKFLOW
@click.argument("case_ids", nargs=-1, metavar="[CASE_ID]...", callback=_case_ids)
@click.option("--all", "every", is_flag=True, help="Replay every case in the store (newest first).")
@click.option("--state", type=_StateChoice(), help="With --all: only cases in this state.")
@_run
async def replay_cases(store: str, workflow: str, case_ids: tuple[str, ...], every: bool,
                       state: str | None) -> None:
    """Re-run cases from their journals on the workflow; exit status 1 if any diverges (or cannot be replayed)."""
    if bool(case_ids) == every:
        raise click.UsageError("give CASE_IDs or --all (not both)")
    if state is not None and not every:
        raise click.UsageError("--state filters --all; drop it, or use --all")
    target = load_target(workflow)
    outcomes: dict[str, int] = {"ok": 0, "diverged": 0, "skipped": 0}
    async with opened(store) as s:
        ids = list(case_ids) or await _all_ids(s, state)
        with _progress() as progress:
            task = progress.add_task("replaying", total=len(ids))
            for case_id in ids:
                outcomes[await _replay_one(s, target, case_id)] += 1
                progress.advance(task)
    said = f"{outcomes['ok']} of {len(ids)} cases replayed without divergence"
    if outcomes["diverged"]:
        said += f"; {outcomes['diverged']} diverged"
    if outcomes["skipped"]:
        said += f"; {outcomes['skipped']} not replayed (SKIPPED above: {workflow} cannot replay them)"
    r.err.print(said)
    if outcomes["diverged"] or outcomes["skipped"]:
        raise SystemExit(1)


async def _replay_one(store: Store, target: Target, case_id: str) -> str:
    """Replay one case and print its line: "ok", "diverged", or "skipped" (no case, no workflow for it)."""
    from .. import replay
    from ..lowlevel import check_version

    try:
        row = await case_row(store, case_id)
        program, warning = target.program_for(row)
    except CliError as exc:  # one case the target cannot replay: say so and go on with the others
        r.out.print(f"SKIPPED   {case_id}  {exc.message}", style="yellow", markup=False)
        return "skipped"
    records = await store.journal(case_id)
    report = replay(program, records, trace_level="none")
    divergence: ReplayDivergence | None = report.divergence
    if divergence is None:
        try:
            check_version(program, row, records)  # what a Substrate on this version would decide
        except ReplayDivergence as exc:
            divergence = exc
    if divergence is None:
        # the vm's `blocked` is, for a person, a case that waits (for a signal, an effect or a timer)
        reached = "waiting" if report.state == "blocked" else report.state
        r.out.print(f"ok        {case_id}  {reached}", markup=False)
        return "ok"
    r.out.print(f"DIVERGED  {case_id}  {divergence}", style="red", markup=False)
    if warning:
        r.out.print(f"  note: {warning}", style="yellow", markup=False)
    return "diverged"


async def _all_ids(store: Store, state: str | None) -> list[str]:
    from ..stores import Listing

    ids: list[str] = []
    before = None
    while True:
        page = await store.cases(Listing(state, limit=1000, before=before))
        ids += [row.case_id for row in page]
        if len(page) < 1000:
            return ids
        before = page[-1].order


def _progress() -> Progress:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    return Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=r.err, transient=True, disable=not r.err.is_terminal,
    )


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _seconds(text: str) -> float:
    found = _DURATION.match(text)
    if found is None:
        raise click.BadParameter(
            f"{text!r} is not a duration: a number with an optional unit s, m, h, d or w (30d, 12h, 90s)",
            param_hint="--older-than",
        )
    seconds = float(found.group(1)) * _UNIT[found.group(2)]
    if not math.isfinite(seconds):
        raise click.BadParameter(f"{text!r} is too large", param_hint="--older-than")
    return seconds


@main.command()
@STORE
@click.option("--older-than", required=True, metavar="DURATION",
              help="Remove cases that ended at least this long ago (30d, 12h, 90s).")
@_run
async def prune(store: str, older_than: str) -> None:
    """Remove ended cases (journal, row, snapshots) from the store."""
    cutoff = time.time() - _seconds(older_than)
    total = 0
    async with opened(store) as s:
        with _progress() as progress:
            task = progress.add_task("pruning", total=None)
            while True:
                gone = await s.prune(cutoff, limit=PRUNE_BATCH)
                total += gone
                progress.update(task, completed=total)
                if gone < PRUNE_BATCH:
                    break
    r.err.print(f"pruned {total} case{'s' if total != 1 else ''} that ended before {r.when(cutoff)}")


@main.command()
@STORE
@CASE_ID
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the owner has re-opened the case (or refused).")
@click.option("--timeout", "patience", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="With --wait: seconds to wait.")
@_run
async def retry(store: str, case_id: str, wait: bool, patience: float) -> None:
    """Re-open a failed case at the step that failed (the owning Substrate runs it again)."""
    async with opened(store) as s:
        row = await case_row(s, case_id)
        await _lifecycle(s, row, "retry", {}, wait, patience, "retry")


@main.command()
@STORE
@CASE_ID
@click.option("--at", "at", type=click.IntRange(min=0), required=True, metavar="SEQ",
              help="The last record of the case's journal the fork keeps (`wfsub journal` lists them).")
@click.option("--id", "new_case_id", metavar="NEW_ID", callback=_case_ids,
              help="The new case's id (default: a fresh one).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the owner has started the fork (or refused).")
@click.option("--timeout", "patience", type=click.FloatRange(min=0, min_open=True), default=10.0,
              show_default=True, help="With --wait: seconds to wait.")
@_run
async def fork(store: str, case_id: str, at: int, new_case_id: str | None, wait: bool, patience: float) -> None:
    """Start a new case from a case's journal up to record SEQ (the owning Substrate replays it, then runs it)."""
    import secrets

    new_id = new_case_id or f"case-{secrets.token_hex(8)}"
    async with opened(store) as s:
        row = await case_row(s, case_id)
        await _lifecycle(s, row, "fork", {"at": at, "new_case_id": new_id}, wait, patience, f"fork {new_id!r}")


async def _lifecycle(store: Store, row: CaseRow, kind: str, body: dict[str, Any], wait: bool, patience: float,
                     what: str) -> None:
    """A retry or fork checked as the owner checks it, put in the inbox, and (`wait`) followed until done."""
    from .. import CaseExists, SignalRejected
    from ..lowlevel import fork_records, retry_record

    try:
        if kind == "retry":
            retry_record(row.case_id, row, await store.journal(row.case_id), time.time())
        else:
            fork_records(row.case_id, await store.journal(row.case_id), body["at"], body["new_case_id"], time.time())
            if await store.row(body["new_case_id"]) is not None:
                raise CaseExists(body["new_case_id"])
    except (SignalRejected, CaseExists, ValueError) as exc:
        raise CliError(f"{exc}; nothing was sent") from None
    inbox_id = await store.inbox_put(row.case_id, kind, body, request_id=None, created_at=time.time())
    await _follow(store, inbox_id, f"{what} of case {row.case_id!r}", wait, patience)


async def _follow(store: Store, inbox_id: int, what: str, wait: bool, patience: float) -> None:
    """An ask of the owner put in the inbox (`wait`): followed until the owner has done it, or refused it."""
    owner = await store.owner()
    if owner is None:
        r.err.print(f"queued: no Substrate owns {store.url} now; the {what} is done when one opens the store")
        return
    if not wait:
        r.err.print(f"sent: the {what} is in the inbox of {owner.owner_id!r}")
        return
    with anyio.move_on_after(patience):
        while True:
            found = await store.inbox_row(inbox_id)
            if found is None:
                r.err.print(f"done: the {what}")
                return
            if found.refused is not None:
                raise CliError(f"the owner refused the {what}: {found.refused}")
            await anyio.sleep(WAIT_POLL)
    raise CliError(
        f"the owner {owner.owner_id!r} did not take the {what} within {patience:g}s; it stays in the inbox and is "
        "done when the owner takes it (check that the Substrate is running and not stuck)"
    )


def _moment(value: str, name: str) -> float | datetime:
    """START or END of `wfsub backfill`: seconds since the epoch, or an ISO 8601 time (with a zone)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither seconds since the epoch nor an ISO 8601 time; e.g. 2026-03-01T00:00:00Z",
            param_hint=name,
        ) from None


@main.command()
@STORE
@click.argument("name")
@click.argument("start")
@click.argument("end")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait until the owner has started the slots' cases (or refused).")
@click.option("--timeout", "patience", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="With --wait: seconds to wait.")
@_run
async def backfill(store: str, name: str, start: str, end: str, wait: bool, patience: float) -> None:
    """Start one case per slot of schedule NAME from START to END, both included (ISO 8601 times with a zone, or
    seconds since the epoch; past only; at most 1000 slots). The Substrate that runs the schedule starts them,
    each with its slot's usual id, so a repeated backfill starts nothing twice. Prints their case ids."""
    from ..lowlevel import backfill_request

    first, last = _moment(start, "START"), _moment(end, "END")
    async with opened(store) as s:
        try:
            ids, body = backfill_request(await s.schedules(), name, first, last, time.time())
        except (TypeError, ValueError) as exc:
            raise CliError(f"{exc}; nothing was sent") from None
        if not ids:
            r.err.print(f"no slot of schedule {name!r} from {start} to {end}: nothing to start")
            return
        inbox_id = await s.inbox_put(ids[0], "backfill", body, request_id=None, created_at=time.time())
        await _follow(s, inbox_id, f"backfill of schedule {name!r} ({len(ids)} slots)", wait, patience)
    for case_id in ids:
        r.out.print(case_id)


@main.command()
@STORE
@CASE_ID
@_run
async def delete(store: str, case_id: str) -> None:
    """Remove one ended case (journal, row, snapshots, tags) from the store at once, with the children it waited
    for."""
    from .. import CaseState, SignalRejected
    from ..lowlevel import delete_ended

    async with opened(store) as s:
        row = await case_row(s, case_id)
        if not CaseState(row.state).ended:
            raise CliError(
                f"case {case_id!r} has not ended (it is {row.state}): only an ended case can be deleted; cancel it "
                f"first (`wfsub cancel {store} {case_id}`)"
            )
        try:
            gone = await delete_ended(s, case_id)
        except SignalRejected as exc:
            raise CliError(str(exc)) from None
    children = len(gone) - 1
    also = f" and {children} child case{'s' if children != 1 else ''} it waited for" if children else ""
    r.err.print(f"deleted case {case_id!r}{also}")


def _tags(pairs: tuple[str, ...]) -> dict[str, str]:
    """`--tag KEY=VALUE` options as a dict (a usage error names a pair without `=`)."""
    tags: dict[str, str] = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise click.UsageError(f"--tag {pair!r}: give KEY=VALUE, e.g. --tag customer=c-17")
        tags[key] = value
    return tags


PRUNE_BATCH = 500  # cases removed per transaction: the owner's writes interleave between batches


# -- workflows ------------------------------------------------------------------------------------------------

NAME = click.option("--name", metavar="NAME", help="With a dict of workflows: which one.")


@main.command()
@click.argument("target", metavar="MODULE:ATTR")
@NAME
@click.option("--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid", show_default=True)
@click.option("--case", "case_id", help="Mark where this case's threads are (needs --store).")
@click.option("--store", "-s", "store", metavar="STORE", help="The store of --case (a path or URL).")
@_run
async def graph(target: str, name: str | None, fmt: str, case_id: str | None, store: str | None) -> None:
    """Draw a workflow as Mermaid or Graphviz DOT (BPMN-like shapes)."""
    from ..contrib.diagram import to_dot, to_mermaid

    loaded = load_target(target)
    highlight: list[str] | None = None
    if case_id is not None:
        if store is None:
            raise click.UsageError("--case needs --store STORE: the store that holds the case")
        async with opened(store) as s:
            row = await case_row(s, case_id)
        if name is None and loaded.registry is not None:
            name = row.workflow
        highlight = list(row.at)
    _, term = loaded.pick(name)
    draw = to_mermaid if fmt == "mermaid" else to_dot
    try:
        text = draw(term, highlight=highlight)
    except ValueError as exc:  # the case's position is not in this workflow (another workflow, another version)
        raise CliError(f"cannot mark case {case_id!r} on {target}: {exc}") from exc
    r.out.out(text, highlight=False)


@main.command(name="validate")
@click.argument("target", metavar="MODULE:ATTR")
@NAME
@_run
async def validate_workflow(target: str, name: str | None) -> None:
    """Check a workflow; exit status 1 with every issue if it has any."""
    from .. import validate

    loaded = load_target(target)
    names = [name] if loaded.term is not None or name is not None else sorted(loaded.registry or {})
    problems = 0
    for each in names:
        picked, term = loaded.pick(each)
        label = f"{target} [{picked}]" if picked else target
        issues = validate(term)
        problems += len(issues)
        for issue in issues:
            r.err.print(f"{label}: {issue.path}: {issue.message}", markup=False)
        if not issues:
            r.out.print(f"{label}: valid", markup=False)
    if problems:
        raise CliError(f"{problems} issue{'s' if problems != 1 else ''} found")


@main.command()
@click.argument("target", metavar="MODULE:ATTR")
@NAME
@_run
async def dis(target: str, name: str | None) -> None:
    """Print a workflow's bytecode."""
    from .. import compile as compile_workflow

    _, term = load_target(target).pick(name)
    try:
        program = compile_workflow(term)
    except InvalidWorkflow as exc:
        raise CliError(f"{target}: {exc}") from exc
    r.out.out(program.dis(), highlight=False)


def _row_json(row: CaseRow) -> dict[str, Any]:
    return r.with_iso({
        "case_id": row.case_id, "workflow": row.workflow, "state": row.state, "started_at": row.started_at,
        "ended_at": row.ended_at, "order": row.order, "at": row.at, "signals": row.signals,
        "effects": row.effects, "timers": [r.with_iso(t, "due") for t in row.timers],
        "suspended_reason": row.suspended_reason, "tags": row.tags, "forked_from": row.forked_from,
    }, "started_at", "ended_at")




"""The inspector's routes: the cases page, the case page with its actions, the live streams, the static files."""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import parse_qsl, quote, unquote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import wfsub
from wfsub import (
    CaseExists,
    CaseHandle,
    CaseNotFound,
    CaseState,
    CaseStatus,
    JournalRecord,
    SignalRejected,
    StoreError,
    Term,
    WfsubError,
)
from wfsub.lowlevel import check_case_id, loads_input, mark_drawing, version_summary

from . import _view
from ._live import Live, sig_hash

_log = logging.getLogger("wfsub.web")
HERE = Path(__file__).parent
CSRF_COOKIE = "wfsub_csrf"  # the CSRF cookie's name begins so; the rest is the app's own (see _Csrf.cookie)
COUNT_CAP = 100  # a state's count reads at most this many cases (~30 us each); beyond, the page says "100+"
COUNTS_TTL = 1.0  # seconds the counts are shared between requests before they are read again (at least)
UPDATE_WAIT = 10.0  # seconds an update from the form waits for its answer (the case keeps it after)
JOURNAL_SHOWN = 500  # the newest records the case page shows unless ?journal=all
JOURNALS_KEPT = 16  # journals kept between requests, each with the status it was read at...
JOURNAL_RECORDS_KEPT = 200_000  # ...and at most this many records in all
STATES = tuple(s.value for s in CaseState)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)  # Mermaid styles its SVG with inline style attributes: style-src needs 'unsafe-inline', scripts do not

SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
)  # on every response the app sends, refusals included

Context = dict[str, Any]
Tags = tuple[tuple[str, str], ...]
ListKey = tuple[str | None, str | None, Tags, str | None, int | None, int]
Auth = Callable[[Request], "bool | Awaitable[bool]"]


class CaseSource(Protocol):
    """What the inspector calls on its source: a `Substrate` (whose reads return at once) or a `wfsub.Client`
    (whose reads are coroutines) has these methods."""

    def status(self, case_id: str) -> CaseStatus | Awaitable[CaseStatus]: ...

    def data(self, case_id: str) -> dict[str, Any] | Awaitable[dict[str, Any]]: ...

    def cases(
        self, *, state: str | None = None, workflow: str | None = None, limit: int = 100, before: int | None = None,
        tags: Mapping[str, str] | None = None, parent: str | None = None,
    ) -> list[CaseStatus] | Awaitable[list[CaseStatus]]: ...

    async def journal(self, case_id: str, *, newest: int | None = None) -> list[JournalRecord]: ...

    async def update(
        self, case_id: str, name: str, payload: Any = None, *, request_id: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (the API's own parameter)
    ) -> Any: ...

    async def retry(self, case_id: str) -> CaseHandle: ...

    async def fork(self, case_id: str, *, at: int, new_case_id: str | None = None) -> CaseHandle: ...

    async def signal(self, case_id: str, name: str, payload: Any = None, *, request_id: str | None = None) -> None: ...

    async def cancel(
        self, case_id: str, compensate: bool = True, *, reason: str = "cancelled", request_id: str | None = None
    ) -> None: ...


R = TypeVar("R")


async def _done(value: R | Awaitable[R]) -> R:
    """A source's answer: a Substrate's reads return it, a Client's are awaited."""
    if inspect.isawaitable(value):
        return await value
    return value


if TYPE_CHECKING:  # mypy holds the Substrate to the protocol the app calls

    def _a_substrate_is_a_source(sub: wfsub.Substrate) -> CaseSource:
        return sub

    def _a_client_is_a_source(client: wfsub.Client) -> CaseSource:
        return client


def app(
    source: CaseSource,
    *,
    read_only: bool = False,
    auth: Auth | None = None,
    workflows: Mapping[str, Any] | None = None,
    redact: Callable[[Any], Any] | None = None,
    page_size: int = 50,
    allowed_hosts: Sequence[str] | None = None,
    secret: bytes | str | None = None,
) -> ASGIApp:
    """The inspector over `source` (a `Substrate`, or a `wfsub.Client` of a store that another process owns) as an
    ASGI application; see the module's docstring.

    - `read_only`: no actions in the pages, and a POST is refused with 403.
    - `auth`: `auth(request) -> bool` (or awaitable), called on every request before anything is read.
    - `workflows`: `{name: term}` or `{name: [older, ..., newest]}`, as given to the Substrate: drawings for the
      versions the source cannot draw (a Substrate draws its own; a store's summaries written by an older wfsub
      keep no drawing).
    - `redact`: a function over data applied to the case data and journal values the pages show.
    - `page_size`: cases per page of the list (a request may ask for up to 500 with `?limit=`).
    - `allowed_hosts`: the host names (`"localhost:8377"` with a port, `"inspect.example.com"` any port,
      `"*.example.com"`) a request's `Host` must name, else 400; None leaves the Host to the app it is mounted in.
    - `secret`: the key that signs CSRF tokens (16 bytes or more); None draws one at random, so tokens last as
      long as this app. Give the same one to every process that serves the inspector behind one address.
    """
    for name in ("status", "data", "cases", "journal", "signal", "update", "cancel", "retry", "fork"):
        if not callable(getattr(source, name, None)):
            raise TypeError(
                f"app(source) needs a Substrate or a wfsub.Client (or an object with status, data, cases, journal, "
                f"signal, update, cancel, retry and fork); {type(source).__name__} has no {name}()"
            )
    if auth is not None and not callable(auth):
        raise TypeError(f"auth must be a function of the request returning True or False, got {auth!r}")
    if redact is not None and not callable(redact):
        raise TypeError(f"redact must be a function over data (or None), got {redact!r}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= 500:
        raise ValueError(f"page_size must be an int from 1 to 500, got {page_size!r}")
    hosts = _Hosts(allowed_hosts) if allowed_hosts is not None else None
    csrf = _Csrf(_secret(secret))
    inspector = _Inspector(source, read_only, _drawings(source, workflows), _guarded(redact), page_size, csrf)
    routes = [
        Route("/", inspector.cases_page),
        Route("/case", inspector.case_page, methods=["GET", "POST"]),  # ?id=: an id a path cannot hold (`..`)
        Route("/case/{case_id:path}", inspector.case_page, methods=["GET", "POST"]),
        Route("/events", inspector.events),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return _Guard(Starlette(routes=routes, exception_handlers={StoreError: _store_unreachable}), auth, hosts)


async def _store_unreachable(request: Request, exc: Exception) -> Response:
    """A read of the store that failed (the server down, the network cut, the file locked): a 503 that says so,
    never a 500 with a traceback; the page answers again once the store does."""
    _log.warning("the inspector could not read the store: %s", exc)
    return PlainTextResponse(
        f"the store could not be read, so this page cannot be shown: {exc}\n"
        "Reload the page once the store answers again.", 503)


# -- the application's state and pages -----------------------------------------------------------------------


class _Inspector:
    def __init__(
        self,
        source: CaseSource,
        read_only: bool,
        drawings: _Drawings,
        redact: Callable[[Any], Any],
        page_size: int,
        csrf: _Csrf,
    ) -> None:
        self.source = source
        self.read_only = read_only
        self.csrf = csrf
        self.drawings = drawings
        self.redact = redact
        self.page_size = page_size
        self.counts_at: dict[Hashable, tuple[float, dict[str, str]]] = {}  # filters -> (read again at, counts)
        self.journals: OrderedDict[tuple[str, bool], tuple[str, list[JournalRecord]]] = OrderedDict()
        self.live = Live(self._read_view)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every value from a case is text in the page, never markup
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(when=_view.when, states=STATES, workflow_names=sorted(drawings.versions),
                                case_url=case_url)

    # -- the cases page ------------------------------------------------------------------------------------

    def _list_query(self, request: Request) -> ListKey:
        q = request.query_params
        state = q.get("state") or None
        if state is not None and state not in STATES:
            raise HTTPException(400, f"state must be one of {', '.join(STATES)}, got {state!r}")
        workflow = _text_param(q.get("workflow") or None, "workflow")
        tags = _tag_params(q.getlist("tag"))
        parent = _case_param(q.get("parent", "").strip() or None, "parent")
        before = _int_param(q.get("before"), "before", 1, MAX_CURSOR)
        limit = _int_param(q.get("limit"), "limit", 1, 500) or self.page_size
        return state, workflow, tags, parent, before, limit

    async def _cases(self, state: str | None, workflow: str | None, tags: Tags, parent: str | None, limit: int,
                     before: int | None = None) -> list[CaseStatus]:
        """One page of `cases()` with the filters given (a filter not given is not passed: a source that predates
        it still answers the others)."""
        extra: dict[str, Any] = {}
        if tags:
            extra["tags"] = dict(tags)
        if parent is not None:
            extra["parent"] = parent
        try:
            return await _done(self.source.cases(state=state, workflow=workflow, limit=limit, before=before,
                                                 **extra))
        except (ValueError, TypeError) as exc:  # a filter the API refuses, with its own message
            raise HTTPException(400, str(exc)) from None

    async def counts(self, workflow: str | None, tags: Tags = (), parent: str | None = None) -> dict[str, str]:
        """Cases per state (under the page's filters but its state), capped at COUNT_CAP, shared between requests
        for a second, or for ten times as long as reading them took (the reads run on the Substrate's event loop:
        they take at most a tenth of it)."""
        now = time.monotonic()
        key = (workflow, tags, parent)
        cached = self.counts_at.get(key)
        if cached is not None and now < cached[0]:
            return cached[1]
        counts = {}
        for state in STATES:
            n = len(await self._cases(state, workflow, tags, parent, COUNT_CAP + 1))
            counts[state] = f"{COUNT_CAP}+" if n > COUNT_CAP else str(n)
        took = time.monotonic() - now
        if len(self.counts_at) > 64:  # one entry per filter seen: keep it bounded
            self.counts_at.clear()
        self.counts_at[key] = (now + max(COUNTS_TTL, 10 * took), counts)
        return counts

    async def _list_view(self, key: ListKey) -> tuple[Hashable, dict[str, Any]]:
        state, workflow, tags, parent, before, limit = key
        page = await self._cases(state, workflow, tags, parent, limit, before)
        counts = await self.counts(workflow, tags, parent)
        rows = [
            {"id": s.case_id, "workflow": s.workflow or "", "state": s.state.value, "at": ", ".join(s.at),
             "waits": _view.waits_for(s), "started": _view.when(s.started_at), "ended": _view.when(s.ended_at),
             "tags": _view.tags_text(s.tags)}
            for s in page
        ]
        signature = (tuple(tuple(r.values()) for r in rows), tuple(counts.values()))
        older = page[-1].order if len(page) == limit and page[-1].order else None
        filters = _query_dict(state, workflow, tags, parent, None, None)
        context = {"rows": rows, "counts": counts, "state": state, "workflow": workflow, "before": before,
                   "tags": [_tag_text(k, v) for k, v in tags], "parent": parent, "limit": limit,
                   "filtered": bool(state or workflow or tags or parent),
                   "newest": _query(state, workflow, tags, parent, None, limit),
                   "by_state": {s: _query(s, workflow, tags, parent, None, None) for s in STATES},
                   "older": _query(state, workflow, tags, parent, older, limit) if older else None,
                   "filters": filters}
        return signature, context

    async def cases_page(self, request: Request) -> Response:
        key = self._list_query(request)
        signature, context = await self._list_view(key)
        live = "/events?" + urlencode([("view", "cases"), *_query_dict(*key), ("sig", sig_hash(signature))])
        return self._html("cases.html", request, context, live=live)

    # -- the case page -------------------------------------------------------------------------------------

    async def _case_view(self, case_id: str, full_journal: bool) -> tuple[Hashable, Callable[[], Awaitable[Context]]]:
        status = await _done(self.source.status(case_id))  # CaseNotFound: the caller's to answer
        signature = status.model_dump_json()

        async def context() -> dict[str, Any]:
            shown, journal_note = await self._journal(case_id, signature, full_journal)
            fingerprint = None
            if shown and shown[0].kind in ("start", "snapshot"):  # (a compacted journal: its snapshot record)
                fingerprint = (shown[0].model_extra or {}).get("fingerprint")
            shown = shown or []
            hidden = 0
            if not full_journal and len(shown) == JOURNAL_SHOWN + 1:  # the start, then the newest records
                hidden = max(0, shown[1].seq - shown[0].seq - 1)
            try:  # read after the journal, so that the status is never older than the journal shown with it
                now = await _done(self.source.status(case_id))
                data = self.redact(await _done(self.source.data(case_id)))
            except CaseNotFound:
                now, data = status, None
            diagram, diagram_note, signals, updates = await self.drawings.show(now, fingerprint)
            return {
                "status": now, "state": now.state.value, "waits": _view.waits_for(now),
                "data": _view.json_text(data), "diagram": diagram, "diagram_note": diagram_note,
                "timeline": _view.timeline(shown, now, self.redact), "hidden": hidden,
                "refused": _view.refused(now), "tags": _view.tags_text(now.tags),
                "journal_note": journal_note, "journal_last": shown[-1].seq if shown else None,
                "full_journal": full_journal, "case_id": case_id,
                "signal_names": signals, "update_names": updates,
            }

        return signature, context

    async def _journal(
        self, case_id: str, signature: str, full: bool
    ) -> tuple[list[JournalRecord] | None, str]:
        """The case's journal as the page shows it: every record (`full`), or the start and the newest
        JOURNAL_SHOWN (`journal(case_id, newest=)` validates only those); or None and why there is none. A
        journal only grows with an input, which changes the case's status: so a journal read at the same status
        is the same journal, and is kept (the newest JOURNALS_KEPT of them)."""
        key = (case_id, full)
        kept = self.journals.get(key)
        if kept is not None and kept[0] == signature:
            self.journals.move_to_end(key)
            return kept[1], ""
        try:
            journal = await (self.source.journal(case_id) if full
                             else self.source.journal(case_id, newest=JOURNAL_SHOWN))
        except ValueError as exc:  # a Substrate without a store keeps no journal
            return None, str(exc)
        except CaseNotFound:
            return None, "the store has no journal for this case"
        now = await _done(self.source.status(case_id))
        if now.model_dump_json() == signature:  # else it moved on while it was read
            self.journals[key] = (signature, journal)
            self.journals.move_to_end(key)
            while len(self.journals) > JOURNALS_KEPT or (
                len(self.journals) > 1 and sum(len(j) for _, j in self.journals.values()) > JOURNAL_RECORDS_KEPT
            ):
                self.journals.popitem(last=False)
        return journal, ""

    async def case_page(self, request: Request) -> Response:
        given = request.path_params.get("case_id")
        if given is None:  # /case?id=...
            given = request.query_params.get("id")
            if not given:
                raise HTTPException(400, "/case needs the case id: /case/<id> or /case?id=<id>")
        case_id = _case_param(given, "the case id")
        message, failed, code = "", False, 200
        form: dict[str, str] = {}
        if request.method == "POST":
            if self.read_only:
                raise HTTPException(403, "this inspector is read only: it takes no actions")
            form = await _form(request)
            self.csrf.check(request, form.get("csrf", ""))
            message, failed, code, lead = await self._act(case_id, form)
            if not failed and lead is not None:  # answered by the page it leads to: a reload does not send it again
                root = request.scope.get("root_path", "")
                return RedirectResponse(case_url(root, lead, **_sent(form)), status_code=303)
        full = request.query_params.get("journal") == "all"
        try:
            signature, make = await self._case_view(case_id, full)
        except CaseNotFound as exc:
            return self._html("missing.html", request, {"case_id": case_id, "message": str(exc)}, status=404)
        live = "/events?" + urlencode({"view": "case", "case": case_id, "sig": sig_hash(signature),
                                       **({"journal": "all"} if full else {})})
        context = await make()
        if request.method == "GET":
            message = _sent_message(request.query_params, context["status"], context["signal_names"])
        # a form refused because the store did not answer keeps its request id: sent again, it is applied once
        request_id = form.get("request_id", "") if code == 503 else ""
        context.update(message=message, failed=failed, form=form,
                       request_id=request_id or secrets.token_urlsafe(16))
        return self._html("case.html", request, context, live=live, status=code)

    async def _act(self, case_id: str, form: dict[str, str]) -> tuple[str, bool, int, str | None]:
        """Do a form's action: (the message to show, whether it was refused, the status code, the case whose
        page it leads to: None to answer on this page, as an update's answer is)."""
        action = form.get("action")
        request_id = form.get("request_id", "").strip() or None  # the form's own: sent again, it is taken once
        try:
            if action in ("signal", "update"):
                name = form.get("name", "").strip()
                if not name:
                    return f"the {action} needs a name: type one the case takes", True, 400, None
                text = form.get("payload", "").strip()
                try:
                    payload = loads_input(text, "the payload") if text else None  # (too deep: a ValueError)
                except json.JSONDecodeError as exc:
                    return (f"the payload is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; "
                            'write it as JSON, e.g. {"by": "ana"}, or leave it empty'), True, 400, None
                except ValueError as exc:  # too deep (its message names the payload), or a number too long to read
                    text = str(exc)
                    if not text.startswith("the payload"):
                        text = (f"the payload cannot be read: {text.split(';')[0]}; send numbers that long as "
                                "strings, or keep the value elsewhere and pass a reference")
                    return text, True, 400, None
                if action == "signal":
                    await self.source.signal(case_id, name, payload, request_id=request_id)
                    return "", False, 200, case_id
                try:
                    answer = await self.source.update(case_id, name, payload, request_id=request_id,
                                                      timeout=UPDATE_WAIT)
                except TimeoutError:
                    return (f"update {name!r} sent, but the case has not answered it within {UPDATE_WAIT:g} s; "
                            "it keeps the update and answers when a wait takes it"), False, 202, None
                return f"update {name!r} answered: {_view.json_text(self.redact(answer))}", False, 200, None
            if action == "cancel":
                compensate = form.get("compensate") == "yes"
                # (as typed: a blank reason is refused as `Substrate.cancel` refuses it, with its message)
                await self.source.cancel(case_id, compensate, reason=form.get("reason", ""), request_id=request_id)
                return "", False, 200, case_id
            if action == "retry":
                await self.source.retry(case_id)
                return "", False, 200, case_id
            if action == "fork":
                at_text = form.get("at", "").strip()
                try:
                    at = int(at_text)
                except ValueError:
                    return (f"fork needs the seq of a record of the journal (a whole number) as 'at', got "
                            f"{at_text!r}"), True, 400, None
                new_id = form.get("new_case_id", "").strip() or None
                if new_id is not None:
                    try:  # (checked here too, so the form's field is named and nothing is sent)
                        check_case_id(new_id, "the new case id",
                                      fix="type an id of visible characters, or leave it empty for a fresh one")
                    except ValueError as exc:
                        return str(exc), True, 400, None
                handle = await self.source.fork(case_id, at=at, new_case_id=new_id)
                return "", False, 200, handle.case_id
        except CaseNotFound as exc:
            return str(exc), True, 404, None
        except (SignalRejected, CaseExists) as exc:
            return str(exc), True, 409, None
        except StoreError as exc:  # the store did not answer (or its answer was lost): the form may be sent again
            return (f"{exc} -- send the form again: it carries the same request id, so the case takes it once"
                    ), True, 503, None
        except (WfsubError, ValueError, TypeError) as exc:  # a payload too big or not JSON-able, a closed Substrate
            return str(exc), True, 400, None
        return (f"unknown action {action!r}: the forms send signal, update, cancel, retry or fork"), True, 400, None

    # -- live ----------------------------------------------------------------------------------------------

    async def _read_view(self, key: Any) -> tuple[Hashable, Callable[[], Awaitable[str]]]:
        """A feed's reader; the key is ("cases", root, *ListKey) or ("case", root, id, all)."""
        root = key[1]
        if key[0] == "cases":
            signature, context = await self._list_view(key[2:])

            async def render_list() -> str:
                return self.env.get_template("_cases_live.html").render(context, root=root, read_only=self.read_only)

            return signature, render_list
        try:
            signature, make = await self._case_view(key[2], key[3])
        except CaseNotFound as exc:
            message = str(exc)

            async def render_missing() -> str:
                return self.env.get_template("_missing_live.html").render(message=message)

            return ("missing", message), render_missing

        async def render_case() -> str:
            return self.env.get_template("_case_live.html").render(await make(), root=root, read_only=self.read_only)

        return signature, render_case

    async def events(self, request: Request) -> Response:
        q = request.query_params
        view = q.get("view")
        key: tuple[Any, ...]
        root = request.scope.get("root_path", "")
        if view == "cases":
            key = ("cases", root, *self._list_query(request))
        elif view == "case" and q.get("case"):
            key = ("case", root, _case_param(q["case"], "case"), q.get("journal") == "all")
        else:
            raise HTTPException(400, "events?view= must be 'cases' (with the list's filters) or 'case' (with case=ID)")
        if self.live.full(key):
            return PlainTextResponse(f"more than {self.live.max_feeds} views are watched; reload later", 503)
        shown = q.get("sig", "")
        return _Stream(self.live, key, shown)

    # -- rendering -----------------------------------------------------------------------------------------

    def _html(
        self, template: str, request: Request, context: dict[str, Any], *, live: str = "", status: int = 200
    ) -> Response:
        token = request.cookies.get(self.csrf.cookie) or ""
        fresh = not self.csrf.issued(token)  # (a cookie this app did not sign, or signed before a restart: replaced)
        if fresh:
            token = self.csrf.issue()
        root = request.scope.get("root_path", "")
        html = self.env.get_template(template).render(
            context, root=root, csrf=token, read_only=self.read_only, live=root + live if live else "",
        )
        # a page carries this browser's CSRF token: no cache (a shared proxy's, the browser's on disk) keeps it
        response = HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})
        if fresh:
            response.set_cookie(self.csrf.cookie, token, path=root or "/", httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
        return response


class _Stream(Response):
    def __init__(self, live: Live, key: Hashable, shown: str) -> None:
        self.live, self.key, self.shown = live, key, shown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.live.stream(self.key, self.shown, scope, receive, send)


# -- drawings ------------------------------------------------------------------------------------------------


class _Drawings:
    """What a case is drawn with, and the signal and update names its forms offer: a term of the workflows given to
    the app (`workflows=`, by name and fingerprint), else the program summary of the case's version as the source
    knows it (`version_summary`: a Substrate's own registered versions, or the summaries its store keeps, each with
    the version's drawing)."""

    def __init__(self, source: CaseSource, versions: dict[str, list[Term]]) -> None:
        self.source = source
        self.versions = versions
        self.library = {name: terms[-1] for name, terms in versions.items() if terms}  # what start_case and call name
        self._fingerprints: dict[Term, str] = {}
        self._names: dict[Term, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self._summaries: dict[tuple[str, str], Mapping[str, Any]] = {}  # (version, name) -> summary
        self._drawn: dict[tuple[Any, tuple[str, ...]], tuple[str, str]] = {}

    def _fingerprint(self, term: Term) -> str:
        found = self._fingerprints.get(term)
        if found is None:
            try:
                program = wfsub.compile(term, library=self.library)
            except wfsub.InvalidWorkflow:  # (not one the Substrate would run: it is drawn, but matches no version)
                self._fingerprints[term] = ""
                self._names[term] = ((), ())
                return ""
            found = self._fingerprints[term] = program.fingerprint
            self._names[term] = (tuple(sorted(program.signals)), tuple(sorted(program.updates)))
        return found

    def _given(self, name: str, fingerprint: str) -> Term | None:
        """The term of `workflows=` that is version `fingerprint` of `name` (None: not given)."""
        return next((t for t in self.versions.get(name, ()) if self._fingerprint(t) == fingerprint), None)

    async def _summary(self, version: str | None, name: str) -> Mapping[str, Any] | None:
        """The summary of a version (None: the newest of `name`, see `version_summary`) as the source knows it.
        A version's summary never changes, so it is kept (one not known yet may be registered later: asked again
        then). The newest is asked each time: a deploy registers a newer one, which a queued case will start on."""
        if version is None:
            return await version_summary(self.source, None, workflow=name)
        key = (version, name)
        found = self._summaries.get(key)
        if found is None:
            found = await version_summary(self.source, version, workflow=name)
            if found is not None:
                if len(self._summaries) > 256:
                    self._summaries.clear()
                self._summaries[key] = found
        return found

    async def show(
        self, status: CaseStatus, started_on: str | None
    ) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
        """(the Mermaid text, a note on what is drawn, the signal names, the update names) for a case, drawn on the
        version it runs now (`status.version`; else the one its first record names, `started_on`). No Mermaid
        text when nothing here holds that version (the note says why), and no names when they are not known (the
        form still sends any name: the API's own check answers)."""
        name = status.workflow
        if name is None:
            return "", "this case started from a term, not a registered name: there is nothing to draw it from", (), ()
        version = status.version or started_on  # (None: a Substrate without a store runs the newest version)
        terms = self.versions.get(name)
        term = self._given(name, version) if version is not None else (terms[-1] if terms else None)
        if term is not None:
            self._fingerprint(term)  # (its names, kept with its fingerprint)
            return *self._draw_term(term, status.at, ""), *self._names[term]
        summary = await self._summary(version, name)
        names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        if summary is not None:
            names = (_keys(summary.get("signals")), _keys(summary.get("updates")))
            drawing = summary.get("drawing")
            if isinstance(drawing, Mapping):
                if version is None:  # the newest version, which a deploy changes: drawn afresh, not kept
                    return *self._draw_summary(drawing, status.at), *names
                drawn = self._kept_drawn((version, name), status.at, lambda: self._draw_summary(drawing, status.at))
                return *drawn, *names
        shown = f"version {version[:12]}" if version is not None else "its version"
        if terms:
            note = (f"drawn on the newest version of {name!r} given in app(workflows=): the case runs on {shown}, "
                    "which is not among the versions given")
            return *self._draw_term(terms[-1], status.at, note), *names
        if summary is not None:
            note = (f"no drawing: the store's summary of {shown} of {name!r} was written by an older wfsub, before "
                    "summaries kept drawings; pass the workflows to app(..., workflows=...) (wfsub web --workflow "
                    "MODULE:ATTR) to draw it")
        else:
            note = (f"no drawing: {shown} of {name!r} is registered neither here nor with the store; pass the "
                    "workflows to app(..., workflows=...) (wfsub web --workflow MODULE:ATTR) to draw it")
        return "", note, *names

    def _draw_term(self, term: Term, at: tuple[str, ...], note: str) -> tuple[str, str]:
        return self._kept_drawn((term, note), at, lambda: self._mermaid_of(term, at, note))

    @staticmethod
    def _mermaid_of(term: Term, at: tuple[str, ...], note: str) -> tuple[str, str]:
        try:
            return wfsub.to_mermaid(term, highlight=at), note
        except ValueError as exc:  # a path this version does not have
            return wfsub.to_mermaid(term), f"{note} {exc}".strip()

    @staticmethod
    def _draw_summary(drawing: Mapping[str, Any], at: tuple[str, ...]) -> tuple[str, str]:
        try:
            text, missing = mark_drawing(drawing, at)
        except ValueError as exc:  # (a summary's drawing that is not one: written by something else)
            return "", f"no drawing: {exc}"
        if missing:
            return text, f"not marked: this version has no node {', '.join(missing)}"
        return text, ""

    def _kept_drawn(self, key: Any, at: tuple[str, ...], draw: Callable[[], tuple[str, str]]) -> tuple[str, str]:
        drawn = self._drawn.get((key, at))
        if drawn is None:
            drawn = draw()
            if len(self._drawn) > 1024:
                self._drawn.clear()
            self._drawn[(key, at)] = drawn
        return drawn


def _keys(names: Any) -> tuple[str, ...]:
    """The sorted names of a summary's `signals` or `updates` mapping (() when it has none)."""
    return tuple(sorted(str(n) for n in names)) if isinstance(names, Mapping) else ()


def _drawings(source: CaseSource, workflows: Mapping[str, Any] | None) -> _Drawings:
    if workflows is not None and not isinstance(workflows, Mapping):
        raise TypeError(f"workflows must be a mapping of name -> workflow (or -> [versions]), got {workflows!r}")
    from ...lowlevel import term_of, workflow_entries

    versions: dict[str, list[Term]] = {}
    for name, given in (workflows or {}).items():
        listed = workflow_entries(given)
        if listed is None:
            raise TypeError(
                f"workflows[{name!r}] must be a workflow term or Workflow(term, input=Model), or a list of them, "
                f"got {given!r}"
            )
        versions[str(name)] = [term_of(t) for t in listed]
    return _Drawings(source, versions)


# -- safety --------------------------------------------------------------------------------------------------


class _Guard:
    """Checks the `Host` (when the app was given `allowed_hosts`) and runs `auth` before every request, and adds
    the security headers to every response."""

    def __init__(self, inner: ASGIApp, auth: Auth | None, hosts: _Hosts | None) -> None:
        self.inner = inner
        self.auth = auth
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:  # (refusals too: they echo the Host they refuse)
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        if self.hosts is not None:
            refused = self.hosts.refusal(Request(scope, receive))
            if refused is not None:
                await refused(scope, receive, with_headers)
                return
        if self.auth is not None:
            refusal = await self._refusal(Request(scope, receive))
            if refusal is not None:
                await refusal(scope, receive, with_headers)
                return
        await self.inner(scope, receive, with_headers)

    async def _refusal(self, request: Request) -> Response | None:
        assert self.auth is not None
        try:
            allowed = self.auth(request)
            if inspect.isawaitable(allowed):
                allowed = await allowed
        except HTTPException as exc:
            return PlainTextResponse(exc.detail, exc.status_code, headers=exc.headers)
        except Exception as exc:
            _log.warning("the inspector's auth raised %s: request refused", type(exc).__name__)
            return PlainTextResponse(f"forbidden: {exc}" if str(exc) else "forbidden", 403)
        if allowed is not True:
            return PlainTextResponse("unauthorized: the inspector's auth refused this request", 401)
        return None


def _guarded(redact: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """`redact` as the pages call it: one that raises withholds the value rather than showing it."""
    if redact is None:
        return lambda value: value

    def guarded(value: Any) -> Any:
        try:
            return redact(value)
        except Exception as exc:
            _log.warning("redact raised %s; the value is withheld", type(exc).__name__)
            return f"<withheld: redact raised {type(exc).__name__}>"

    return guarded


class _Hosts:
    """The host names a request's `Host` must name (`allowed_hosts=`): `name` (any port), `name:port`, `*.domain`
    (any name under it), `*` (any). A request for another name is refused before anything is read, so a page on
    another site whose name resolves to this address (DNS rebinding) reads nothing and acts on nothing."""

    def __init__(self, allowed: Sequence[str]) -> None:
        if isinstance(allowed, str) or not isinstance(allowed, Sequence):
            raise TypeError(
                f"allowed_hosts must be a list of host names (e.g. ['localhost:8377', '127.0.0.1:8377']), "
                f"got {allowed!r}"
            )
        self.shown = [str(a) for a in allowed]
        self.allowed: list[tuple[str, int | None]] = []
        for given in allowed:
            found = _host_port(given) if isinstance(given, str) else None
            if found is None:
                raise ValueError(
                    f"allowed_hosts holds {given!r}, which is not a host name: give names such as 'localhost', "
                    "'localhost:8377', '[::1]:8377' or '*.example.com'"
                )
            self.allowed.append(found)

    def refusal(self, request: Request) -> Response | None:
        header = request.headers.get("host", "")
        found = _host_port(header)
        if found is not None:
            name, port = found
            if port is None:
                port = 443 if request.url.scheme in ("https", "wss") else 80
            if any(_host_matches(pattern, want, name, port) for pattern, want in self.allowed):
                return None
        return PlainTextResponse(
            f"this inspector answers only requests for {', '.join(self.shown)}, and this one names the host "
            f"{header!r}: open it at one of those addresses. (A host it does not know is refused, so that a web "
            "page whose name points at this address, DNS rebinding, reads nothing; to serve it under another name, "
            "add that name to app(..., allowed_hosts=[...]), or pass --allow-host to wfsub web.)", 400)


def _host_port(text: str) -> tuple[str, int | None] | None:
    """A Host header's (or an allowed host's) name, lowercased, and its port (None: none given); None when it is
    not a host (empty, a bad port, characters no host has)."""
    text = text.strip().lower()
    if text.startswith("["):  # an IPv6 address: [::1] or [::1]:8377
        name, sep, rest = text.partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        name, port_text = name + "]", rest[1:]
    elif text.count(":") > 1:  # a bare IPv6 address (as an allowed host): no port
        name, port_text = f"[{text}]", ""
    else:
        name, _, port_text = text.partition(":")
    if not name or any(c in name for c in "/@?#\\ \t"):
        return None
    if not port_text:
        return name, None
    if not _ascii_number(port_text) or not 0 < int(port_text) < 65536:
        return None
    return name, int(port_text)


def _ascii_number(text: str) -> bool:
    """Whether `text` is digits 0-9 only: `str.isdigit()` also takes `²` or `١`, which `int()` then refuses (or
    reads as another number), so it never decides what a request may name."""
    return bool(text) and text.isascii() and text.isdigit()


def _host_matches(pattern: str, want: int | None, name: str, port: int) -> bool:
    if want is not None and want != port:
        return False
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == pattern


class _Csrf:
    """CSRF tokens the app issues and signs: `<nonce>.<signature>`, the signature an HMAC-SHA256 of the nonce under
    the app's secret. A page is served with the token of this browser's cookie (one is issued when it has none this
    app signed), and a POST is taken only when its form carries that same token and the app signed it: a token the
    sender made up, with whatever cookie comes with it, is refused.

    The cookie's name is the app's own, derived from its secret: browsers share cookies between the ports of one
    host name, so two inspectors on `localhost:8377` and `localhost:8378` under one name would each replace the
    other's token, and every form of the first would be refused after a page of the second was opened. Apps given
    the same secret (processes behind one address) share the name, as they take each other's tokens."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        tag = hmac.new(key, b"wfsub-web-csrf-cookie", hashlib.sha256).hexdigest()[:16]
        self.cookie = f"{CSRF_COOKIE}_{tag}"

    def issue(self) -> str:
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._sign(nonce)}"

    def _sign(self, nonce: str) -> str:
        mac = hmac.new(self._key, b"wfsub-web-csrf\0" + nonce.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def issued(self, token: str) -> bool:
        """Whether this app signed `token`."""
        nonce, dot, signature = token.partition(".")
        if not dot or not 16 <= len(nonce) <= 64 or not nonce.isascii() or not signature.isascii():
            return False
        return hmac.compare_digest(signature.encode(), self._sign(nonce).encode())

    def check(self, request: Request, sent: str) -> None:
        cookie = request.cookies.get(self.cookie, "")
        if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
            raise HTTPException(
                403, "the form's CSRF token is missing or does not match this browser's: reload the page and send it "
                     "again"
            )
        if not self.issued(sent):
            raise HTTPException(
                403, "the form's CSRF token was not issued by this inspector (or by it before it restarted with "
                     "another secret): reload the page and send it again"
            )


def _secret(secret: bytes | str | None) -> bytes:
    """The key CSRF tokens are signed with: the one given (16 bytes or more), else a random one for this app."""
    if secret is None:
        return secrets.token_bytes(32)
    key = secret.encode() if isinstance(secret, str) else secret
    if not isinstance(key, bytes) or len(key) < 16:
        raise ValueError(
            "secret must be bytes or a str of 16 bytes or more (e.g. secrets.token_bytes(32), kept in the "
            f"deployment's secrets), got {type(secret).__name__} of {len(key) if isinstance(key, bytes) else '?'}"
        )
    return key


def case_url(root: str, case_id: str, **query: str) -> str:
    """The address of a case's page (`root`: where the app is mounted): its id percent-encoded whole (a `/`, `%`,
    `?`, `#` or `..` in it is part of the id), so no id leads to another page. An id that is a dot segment (`.`,
    `..`) goes in the query instead: a browser resolves such a segment, even percent-encoded, before it asks."""
    if case_id in (".", ".."):
        return f"{root}/case?{urlencode({'id': case_id, **query})}"
    here = f"{root}/case/{quote(case_id, safe='')}"
    return f"{here}?{urlencode(query)}" if query else here


# -- small helpers -------------------------------------------------------------------------------------------


def _sent(form: Mapping[str, str]) -> dict[str, str]:
    """The query of the page an action that went through leads to: what was sent, never free text to show."""
    action = form.get("action")
    if action == "signal":
        return {"sent": "signal", "name": form.get("name", "").strip()[:200]}
    if action == "retry":
        return {"sent": "retry"}
    if action == "fork":
        return {"sent": "fork", "at": form.get("at", "").strip()[:20]}
    return {"sent": "cancel", "compensate": "yes" if form.get("compensate") == "yes" else "no"}


def _sent_message(query: Mapping[str, str], status: CaseStatus, signal_names: Sequence[str]) -> str:
    """The message the page an action led to shows. Anyone can send a link with any query, so the words are built
    here and the query only picks among them: a signal's name is shown only when it is one the case's workflow
    takes, a fork's origin is the one the case's status names, and its record is a number."""
    sent = query.get("sent")
    if sent == "signal":
        name = query.get("name", "")
        return f"signal {name!r} sent" if name in signal_names else "signal sent"
    if sent == "cancel":
        return f"cancel sent ({'with' if query.get('compensate') == 'yes' else 'without'} compensation)"
    if sent == "retry":
        return "retried: the case is re-opened at the step that failed"
    if sent == "fork" and status.forked_from is not None:
        at = query.get("at", "")
        record = f" at record {int(at)}" if _ascii_number(at) and len(at) <= 20 else ""
        return f"forked from case {status.forked_from!r}{record}"
    return ""


FORM_LIMIT = 2 * 1024 * 1024  # bytes of one posted form (a signal payload is at most 1 MiB by default)


async def _form(request: Request) -> dict[str, str]:
    """The posted form (urlencoded, as the pages send it), read without a multipart parser."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise HTTPException(415, f"post the form as application/x-www-form-urlencoded, got {kind or 'no type'!r}")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_LIMIT:
            raise HTTPException(413, f"the form is larger than {FORM_LIMIT:,} bytes: send a smaller payload")
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        raise HTTPException(400, "the form is not UTF-8: send it from the page") from None
    return dict(pairs)


def _int_param(text: str | None, name: str, low: int, high: int | None) -> int | None:
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise HTTPException(400, f"{name} must be a whole number, got {text!r}") from None
    if value < low or (high is not None and value > high):
        raise HTTPException(400, f"{name} must be {low} or more" + (f" and at most {high}" if high else "") +
                            f", got {value}")
    return value


MAX_CURSOR = 2**63 - 1  # the largest `before` a store's order column can hold


def _case_param(text: str | None, name: str) -> Any:
    """`text`, a case id to look up (the address's, `parent=`, `case=`), unless no store could hold it (a NUL, a
    lone surrogate): a 400 saying so, as every door refuses it (`check_case_id`)."""
    if text is not None:
        try:
            check_case_id(text, name, new=False, fix="remove it from the address (a NUL is %00)")
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
    return text


def _text_param(text: str | None, name: str) -> Any:
    """`text` unless it holds a NUL character, which no store can look up (Postgres refuses it in text)."""
    if text is not None and "\x00" in text:
        raise HTTPException(400, f"{name} holds a NUL character (%00), which no case id, name or tag can: "
                                 f"remove it from the address")
    return text


def _tag_params(given: list[str]) -> Tags:
    """The `tag=key=value` filters of the list (several: every pair must hold), sorted (one key per view). The text
    splits at its first `=`; the key is percent-decoded, so a key holding `=` (or `%`) is written with `%3D` (`%25`),
    as the page's own links write it (`_tag_text`). Neither is stripped: a tag is any str, spaces included."""
    tags: dict[str, str] = {}
    for text in given:
        if not text:  # (the filter form's field left empty)
            continue
        written, sep, value = _text_param(text, "tag").partition("=")
        key = unquote(written)
        if not sep or not key:
            raise HTTPException(400, f"tag must be key=value (e.g. tag=customer=ana; a key holding '=' writes it "
                                     f"%3D, and '%' as %25), got {text!r}")
        tags[key] = value
    return tuple(sorted(tags.items()))


def _tag_text(key: str, value: str) -> str:
    """A tag filter as `?tag=` and the filter form carry it (read back by `_tag_params`)."""
    return f"{key.replace('%', '%25').replace('=', '%3D')}={value}"


def _query_dict(
    state: str | None, workflow: str | None, tags: Tags, parent: str | None, before: int | None, limit: int | None
) -> list[tuple[str, Any]]:
    given = [("state", state), ("workflow", workflow), *(("tag", _tag_text(k, v)) for k, v in tags),
             ("parent", parent), ("before", before), ("limit", limit)]
    return [(k, v) for k, v in given if v is not None]


def _query(
    state: str | None, workflow: str | None, tags: Tags, parent: str | None, before: int | None, limit: int | None
) -> str:
    return urlencode(_query_dict(state, workflow, tags, parent, before, limit))

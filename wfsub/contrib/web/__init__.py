"""`wfsub.contrib.web`: a case inspector in the browser, an ASGI application (Starlette) over a Substrate, or over
a `wfsub.Client` of a store another process owns (what `wfsub web STORE` serves).

    from fastapi import FastAPI
    from wfsub.contrib.web import app as inspector

    api = FastAPI()
    api.mount("/inspect", inspector(sub, workflows=WORKFLOWS, auth=is_operator))

It needs the `web` extra (`pip install 'wfsub[web]'`: starlette and jinja2); `import wfsub` never imports it.

Pages:

- `/` the cases, newest first: counts per state, filters by state and workflow (the filters `Substrate.cases()`
  has: it has no tag or parent filter, so neither has the page), paging by cursor (`before=`, the `order` of the
  last case of the page, as `cases()` takes it), each row with its case id, workflow, state, where it is (`at`),
  what it waits for, and its start and end times (ISO 8601 in UTC). A page reads one page of the store (the list
  never loads every case). The public API has no count, so each state's count reads at most 100 cases of that
  state and shows "100+" beyond; the counts are shared by every request for a second, or for ten times as long
  as reading them took when that is longer (`cases(state=)` also looks at every case in memory).
- `/case/<id>` one case: its status, its data, its workflow drawn by `to_mermaid(term, highlight=status.at)`
  (rendered in the page by the copy of Mermaid shipped in this package, `static/mermaid.min.js`, MIT licence in
  `static/mermaid.LICENSE`: the page loads nothing from the network), the journal as a timeline (start, inputs,
  effect outcomes with their errors, timers fired and armed with their due times, the end; the newest 500 records,
  all with `?journal=all`), the failure with its traceback, and the actions: a signal (name and JSON payload) and
  cancel, with or without compensation. An action is answered on the page with the API's own message
  (`SignalRejected`, `CaseNotFound`, a payload that is not JSON).

Both pages follow their data live without a reload: a small script (`static/inspector.js`, no framework) listens
to server-sent events at `/events` and swaps the part of the page that changed. The public API has no change
feed, so one watcher of each view (a filtered list page, a case) reads it four times a second for everyone who
watches it, and tells them only when it changed; a client that is slow to read skips to the newest version, so
neither the change rate nor the number of clients grows a backlog.

The drawing needs the workflows themselves, which the Substrate does not hand out: pass `workflows=` (the mapping
given to `Substrate(workflows=...)`, versions included; a case is drawn on the version whose fingerprint its
journal recorded). The Substrate's `redact=` covers what it says (status messages and tracebacks), not `data()`
or the journal; pass the same function as `redact=` here to apply it to the data and journal values the pages
show.

Safety: every value from a case is escaped (Jinja2 autoescape: a `<script>` in data stays text); every response
carries a Content-Security-Policy that allows scripts and connections from the app's own origin only; actions are
POSTs carrying a CSRF token (a double-submit cookie, SameSite=Strict); `read_only=True` leaves them out of the page
and refuses them (403); `auth=`, a function of the Starlette `Request` (sync or async), guards every route: False
answers 401, raising `starlette.exceptions.HTTPException` answers its status, any other exception 403.
"""

from __future__ import annotations

from ._app import CaseSource as CaseSource
from ._app import app as app

__all__ = ["CaseSource", "app"]

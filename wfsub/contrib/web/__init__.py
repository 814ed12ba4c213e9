"""`wfsub.contrib.web`: a case inspector in the browser, an ASGI application (Starlette) over a Substrate, or over
a `wfsub.Client` of a store another process owns (what `wfsub web STORE` serves).

    from fastapi import FastAPI
    from wfsub.contrib.web import app as inspector

    api = FastAPI()
    api.mount("/inspect", inspector(sub, workflows=WORKFLOWS, auth=is_operator))

It needs the `web` extra (`pip install 'wfsub[web]'`: starlette and jinja2); `import wfsub` never imports it.

Pages:

- `/` the cases, newest first: counts per state (queued included), filters by state, workflow, tags
  (`tag=key=value`, several: every pair must hold) and parent (`parent=ID`: the cases it started), paging by
  cursor (`before=`, the `order` of the last case of the page, as `cases()` takes it; the link to the older page
  keeps the filters), each row with its case id, workflow, state, where it is (`at`), what it waits for, its tags,
  and its start and end times (ISO 8601 in UTC). A page reads one page of the store (the list never loads every
  case). The public API has no count, so each state's count reads at most 100 cases of that state (under the
  page's other filters) and shows "100+" beyond; the counts are shared by every request for a second, or for ten
  times as long as reading them took when that is longer (`cases(state=)` also looks at every case in memory).
- `/case/<id>` one case: its status (tags, version and the version it migrated from, the case it was forked from,
  parent and children as links, its queue fields while queued), its data, its workflow drawn by
  `to_mermaid(term, highlight=status.at)` (rendered in the page by the copy of Mermaid shipped in this package,
  `static/mermaid.min.js`, MIT licence in `static/mermaid.LICENSE`: the page loads nothing from the network), the
  inputs its owner refused (`status().refused`), the journal as a timeline (start, inputs, effect outcomes with
  their errors, timers fired and armed with their due times, migrations, retries, the end; the start and the
  newest 500 records, read with `journal(case_id, newest=500)`, all with `?journal=all`), the failure with its
  traceback, and the actions: signal and update (a name, offered from those the case's version takes when
  `workflows=` holds it, and a JSON payload; an update's answer is shown on the page, waiting up to 10 s for it),
  cancel with or without compensation, retry (a failed or poison-suspended case) and fork (at a record's seq,
  optionally with the new case's id; it leads to the new case's page). Each action is the API's own call, and a
  refusal is answered on the page with the API's own message (`SignalRejected`, `CaseNotFound`, `CaseExists`, a
  payload that is not JSON, a fork at a seq the journal does not hold); over a Client, names and payloads are
  checked against the program summary as the Client checks them.

Both pages follow their data live without a reload: a small script (`static/inspector.js`, no framework) listens
to server-sent events at `/events` and swaps the part of the page that changed. The public API has no change
feed, so one watcher of each view (a filtered list page, a case) reads it four times a second for everyone who
watches it, and tells them only when it changed; a client that is slow to read skips to the newest version, so
neither the change rate nor the number of clients grows a backlog.

The drawing needs the workflows themselves, which the Substrate does not hand out: pass `workflows=` (the mapping
given to `Substrate(workflows=...)`, versions included; a case is drawn on the version it runs on, found by
fingerprint, and its forms offer that version's signal and update names). The Substrate's `redact=` covers what
it says (status messages and tracebacks), not `data()` or the journal; pass the same function as `redact=` here
to apply it to the data, journal values and update answers the pages show.

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

"""`wfsub.contrib.web`: a case inspector in the browser, an ASGI application (Starlette) over a Substrate, or over
a `wfsub.Client` of a store another process owns (what `wfsub web STORE` serves).

    from fastapi import FastAPI
    from wfsub.contrib.web import app as inspector

    api = FastAPI()
    api.mount("/inspect", inspector(sub, auth=is_operator))

It needs the `web` extra (`pip install 'wfsub[web]'`: starlette and jinja2); `import wfsub` never imports it.

Pages:

- `/` the cases, newest first: counts per state (queued included), filters by state, workflow, tags
  (`tag=key=value`, several: every pair must hold; split at the first `=`, nothing stripped, a `=` or `%` in the
  key written `%3D` or `%25`) and parent (`parent=ID`: the cases it started), paging by
  cursor (`before=`, the `order` of the last case of the page, as `cases()` takes it; the link to the older page
  keeps the filters), each row with its case id, workflow, state, where it is (`at`), what it waits for, its tags,
  and its start and end times (ISO 8601 in UTC). A page reads one page of the store (the list never loads every
  case). The public API has no count, so each state's count reads at most 100 cases of that state (under the
  page's other filters) and shows "100+" beyond; the counts are shared by every request for a second, or for ten
  times as long as reading them took when that is longer (`cases(state=)` also looks at every case in memory).
- `/case/<id>` one case (its id percent-encoded whole, `/` and `%` included; `/case?id=<id>` for an id that is a dot
  segment, `.` or `..`, which a browser would resolve away): its status (tags, version and the version it migrated
  from, the case it was forked from, parent and children as links, its queue fields while queued), its data, its
  workflow drawn as `to_mermaid(term, highlight=status.at)` draws it (rendered in the page by the copy of Mermaid
  shipped in this package, `static/mermaid.min.js`, MIT licence in `static/mermaid.LICENSE`: the page loads nothing
  from the network), the inputs its owner refused (`status().refused`), the journal as a timeline (start, inputs,
  effect outcomes with their errors, timers fired and armed with their due times, migrations, retries, the end; the
  start and the newest 500 records, read with `journal(case_id, newest=500)`, all with `?journal=all`), the failure
  with its traceback, and the actions: signal and update (a name, offered from those the case's version takes, and a
  JSON payload; an update's answer is shown on the page, waiting up to 10 s for it), cancel with or without
  compensation, retry (a failed or poison-suspended case) and fork (at a record's seq, optionally with the new
  case's id; it leads to the new case's page). Each action is the API's own call, and a refusal is answered on the
  page with the API's own message (`SignalRejected`, `CaseNotFound`, `CaseExists`, a payload that is not JSON, a
  fork at a seq the journal does not hold); over a Client, names and payloads are checked against the program
  summary as the Client checks them.

Both pages follow their data live without a reload: a small script (`static/inspector.js`, no framework) listens
to server-sent events at `/events` and swaps the part of the page that changed. The public API has no change
feed, so one watcher of each view (a filtered list page, a case) reads it four times a second for everyone who
watches it, and tells them only when it changed; a client that is slow to read skips to the newest version, so
neither the change rate nor the number of clients grows a backlog.

A case is drawn on the version it runs (`status().version`), and its forms offer that version's signal and update
names: `app(sub)` draws the Substrate's own workflows, versions included, with nothing more passed; over a
Client (and in `wfsub web STORE`) the drawing is the one the version's program summary keeps, written by the
Substrate that registered the version with the store (`wfsub.lowlevel.version_summary`). A summary written by an
older wfsub keeps none: pass `workflows=` (the mapping given to `Substrate(workflows=...)`) to draw those cases
(a term given there is found by fingerprint, and is drawn first). The Substrate's `redact=` covers what it says
(status messages and tracebacks), not `data()` or the journal; pass the same function as `redact=` here to apply
it to the data, journal values and update answers the pages show.

Safety: with `allowed_hosts=` (names, `name:port`, `*.domain`) a request whose `Host` names another host is
refused with 400 before anything is read, so a page whose DNS name an attacker rebinds to the inspector's address
reads nothing and acts on nothing (`wfsub web` allows only the address it serves); None leaves the Host to the
app it is mounted in (as Starlette's `TrustedHostMiddleware` does there). Every value from a case is escaped
(Jinja2 autoescape: a `<script>` in data stays text), and every case id is percent-encoded whole in every link and
form action, so no id (`a/../b`, `%2F`, `..`) leads to or acts on another case; every response (a refusal of the
Host or by `auth` included) carries a Content-Security-Policy that allows scripts and connections from the app's
own origin only, and the pages `Cache-Control: no-store`; actions are POSTs
carrying a CSRF token the app issued and signed (HMAC-SHA256 under `secret=`, random per app unless given; the
form's token must be the one in this browser's cookie, SameSite=Strict, and signed by the app: a token the sender
made up is refused whatever cookie comes with it; the cookie is named after the secret, so inspectors on two ports
of one host name keep their own); several processes behind one address share one `secret=`;
`read_only=True` leaves the actions out of the page and refuses them (403); `auth=`, a function of the Starlette
`Request` (sync or async), guards every route: False answers 401, raising `starlette.exceptions.HTTPException`
answers its status, any other exception 403.
"""

from __future__ import annotations

from ._app import CaseSource as CaseSource
from ._app import app as app

__all__ = ["CaseSource", "app"]

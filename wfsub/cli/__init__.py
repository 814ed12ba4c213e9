"""The `wfsub` command (also `python -m wfsub`): see and steer the cases in a store, and look at workflows.

    wfsub cases   STORE [--state S] [--workflow NAME] [--tag K=V] [--parent ID] [--limit N] [--json]
    wfsub show    STORE CASE_ID [--json]
    wfsub data    STORE CASE_ID
    wfsub journal STORE CASE_ID                          (JSON lines)
    wfsub trace   STORE CASE_ID --workflow app:flows     (replayed from the journal)
    wfsub signal  STORE CASE_ID NAME ['{"json": 1}'] [--request-id ID] [--no-wait]
    wfsub update  STORE CASE_ID NAME ['{"json": 1}'] [--request-id ID] [--timeout S]   (prints the answer)
    wfsub cancel  STORE CASE_ID [--reason R] [--region NAME] [--no-compensate]
    wfsub replay  STORE (CASE_ID... | --all) --workflow app:flows   (exit status 1 on a divergence)
    wfsub retry   STORE CASE_ID                          (a failed case, at the step that failed)
    wfsub fork    STORE CASE_ID --at SEQ [--id NEW]
    wfsub delete  STORE CASE_ID                          (an ended case)
    wfsub schedules STORE [--json]
    wfsub backfill STORE NAME START END                  (one case per past slot; START/END: ISO 8601 or seconds)
    wfsub prune   STORE --older-than 30d
    wfsub graph   app:flow [--format mermaid|dot] [--case CASE_ID --store STORE]
    wfsub validate app:flow
    wfsub dis     app:flow
    wfsub web     STORE [--port 8377] [--host 127.0.0.1] [--workflow app:flows] [--read-only]

STORE is a path or URL, as for `Substrate(store=...)`; `--workflow` may come from WFSUB_WORKFLOW. Signals and
cancels go through the store's inbox: the Substrate that owns the store checks it every 0.2 s (a
`PRAGMA data_version` read, no table scan) and records them in the case's journal; the command waits for that
(`--no-wait` does not), and a refusal (an unknown signal, a payload its model rejects) is reported with exit
status 1. With no Substrate running, the input stays queued until one opens the store.
"""

from . import _web as _web  # noqa: F401  (registers `wfsub web` on main)
from ._commands import main as main

__all__ = ["main"]

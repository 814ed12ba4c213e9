"""The `wfsub` command (also `python -m wfsub`): see and steer the cases in a store, and look at workflows.

    wfsub cases   --store cases.db [--state S] [--workflow NAME] [--limit N] [--json]
    wfsub show    --store cases.db CASE_ID [--json]
    wfsub data    --store cases.db CASE_ID
    wfsub journal --store cases.db CASE_ID                       (JSON lines)
    wfsub trace   --store cases.db --workflow app:flows CASE_ID  (replayed from the journal)
    wfsub signal  --store cases.db CASE_ID NAME ['{"json": 1}'] [--request-id ID] [--no-wait]
    wfsub cancel  --store cases.db CASE_ID [--reason R] [--region NAME] [--no-compensate]
    wfsub replay  --store cases.db --workflow app:flows (CASE_ID... | --all)   (exit 1 on divergence)
    wfsub prune   --store cases.db --older-than 30d
    wfsub graph   app:flow [--format mermaid|dot] [--case CASE_ID --store cases.db]
    wfsub validate app:flow
    wfsub dis     app:flow

`--store` may come from WFSUB_STORE and `--workflow` from WFSUB_WORKFLOW. Signals and cancels go through the
store's inbox: the Substrate that owns the store checks it every 0.2 s (a `PRAGMA data_version` read, no
table scan) and records them in the case's journal; the command waits for that (`--no-wait` does not), and a
refusal (an unknown signal, a payload its model rejects) is reported with exit status 1. With no Substrate
running, the input stays queued until one opens the store.
"""

from ._commands import main as main

__all__ = ["main"]

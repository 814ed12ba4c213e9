"""The chaos campaign's checker: what the stores hold, held against what the clients were told and what the
effects did. A pure function of the history, so a unit test can feed it a doctored one.

Its inputs, all gathered after the faults stopped and the workload had time to finish:

- the plan (`CaseSpec`s: each case, its calls, the state it must end in);
- the clients' `ack` lines: every outcome of every call (`ok` = the call returned: acknowledged);
- each case's journal (records as the store returns them) and, on Postgres, the epoch each record was appended
  under;
- the effects' attempt lines (`_workload.step`), with the node's view of its lease;
- the monitor's samples of every case row taken once the faults stopped (time, state, last seq, owner, effects in
  flight, next due time, inbox inputs waiting).

Each violation names its kind, the case, what is wrong, and the records or lines that show it:

    acknowledged-input-lost      a call that returned (start, signal, cancel) is not in the case's journal
    input-applied-twice          one request id (or one start) appears twice in a journal
    applied-input-reported-refused  a call was answered SignalRejected, yet its request id is in the journal
    start-refused                a start made again with the same case id and data was refused (CaseExists)
    call-never-acknowledged      a client call never returned, though the faults stopped long enough before
    case-not-ended               a started case has no `end` once the workload had time to finish
    case-ended-twice             two `end` records
    wrong-outcome                the case ended in another state than its calls lead to (e.g. failed)
    record-after-end             a record after the `end`
    journal-gap                  sequence numbers that are not 0, 1, 2, ...
    row-behind-journal           the case row, as last sampled, names an older last seq than the journal holds
                                 (more than 2 s after that record was appended); row-ahead-of-journal: a newer one
    epoch-went-back              a record appended under a lower epoch than one before it
    effect-while-lease-in-doubt  an effect attempt started when more than a lease had passed, on the node's own
                                 monotonic clock, since it sent the last lease renewal that succeeded (or before
                                 it had any): its lease may have expired and another node may hold the case
    effect-after-end             an effect attempt started more than a second after its case's `end` was
                                 journaled (a stale actor still running a case that ended elsewhere)
    process-crashed              a node, the SQLite owner or its client ended by itself (no fault killed it)
    open-gave-up-early           a node's store open failed sooner than the store's retry window after it began
                                 (a dropped connection or a restarted server is to be retried that long); one that
                                 failed after the window (a long outage) is not a violation: the node starts again
    case-stranded                once faults stopped, a case had work waiting (running, an effect in flight, a
                                 due timer, an inbox input, or every call of its plan acknowledged: the plan's
                                 workflows have only effects and timers after their last signal) and its journal
                                 did not grow for longer than a lease plus the store's retry window (whoever owned
                                 it, alive or not)
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._workload import CaseSpec

LIVE_STATES = {"initializing", "running", "waiting_effect"}
DUE_SLACK = 1.0  # a timer this much past its due time with nothing journaled counts as work waiting


@dataclass
class Violation:
    kind: str
    case: str
    detail: str
    evidence: list[Any] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"VIOLATION {self.kind} case={self.case}: {self.detail}"]
        lines += [f"    {json.dumps(e, default=str, separators=(',', ':'))[:600]}" for e in self.evidence]
        return "\n".join(lines)


@dataclass
class History:
    specs: Sequence[CaseSpec]
    acks: Sequence[Mapping[str, Any]] = ()
    journals: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    epochs: Mapping[str, Sequence[tuple[int, int]]] = field(default_factory=dict)
    effects: Sequence[Mapping[str, Any]] = ()
    samples: Sequence[Mapping[str, Any]] = ()
    exits: Sequence[Mapping[str, Any]] = ()  # processes that ended by themselves (not killed by a fault)
    open_failures: Sequence[Mapping[str, Any]] = ()  # nodes whose store could not be opened (`open-failed`)
    lease_seconds: float = 2.0
    stranded_after: float = 10.0  # a lease plus the store's retry window


def check(h: History) -> list[Violation]:
    out: list[Violation] = []
    out += _calls(h)
    out += _journals(h)
    out += _effects(h)
    out += _stranded(h)
    for f in h.open_failures:
        if f["after"] < f["retry_for"] - 0.5:
            out.append(Violation("open-gave-up-early", "-", f"node {f['node']!r} ({f['src']}, incarnation "
                                 f"{f['inc']}) could not open its store and gave up after {f['after']} s, within the "
                                 f"store's retry window ({f['retry_for']} s)", [dict(f)]))
    for e in h.exits:
        out.append(Violation("process-crashed", "-", f"{e['src']} (incarnation {e['inc']}) ended by itself with "
                             f"status {e['rc']}; its traceback's wfsub frames and exceptions follow",
                             list(e.get("stderr", []))))
    return out


def _short(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("data", "digest", "result", "items")}


def _calls(h: History) -> list[Violation]:
    out = []
    by_key: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for ack in h.acks:
        by_key[ack["key"]].append(ack)
    for spec in h.specs:
        journal = h.journals.get(spec.case_id, [])
        key = f"start:{spec.case_id}"
        outcomes = by_key.get(key, [])
        starts = [r for r in journal if r.get("kind") == "start"]
        # a compacted journal: its snapshot record holds the start and the request ids of the records it replaced
        snap = journal[0] if journal and journal[0].get("kind") == "snapshot" else None
        if snap is not None:
            starts.append(snap.get("start") or {})
        compacted_ids = set((snap.get("state") or {}).get("request_ids", ())) if snap is not None else set()
        if any(a["outcome"] == "ok" for a in outcomes) and not starts:
            out.append(Violation("acknowledged-input-lost", spec.case_id, "new_case returned but the journal has no "
                                 "start record", [*outcomes[-3:], *map(_short, journal[:3])]))
        if len(starts) > 1:
            out.append(Violation("input-applied-twice", spec.case_id, f"{len(starts)} start records",
                                 list(map(_short, starts))))
        if refused := [a for a in outcomes if a["outcome"] == "refused"]:
            out.append(Violation("start-refused", spec.case_id, "a start made again with the same case id and "
                                 "data was refused", refused))
        if not any(a["outcome"] in ("ok", "refused") for a in outcomes):
            out.append(Violation("call-never-acknowledged", spec.case_id, "new_case never returned after the "
                                 "faults stopped", outcomes[-3:]))
            continue
        for op in spec.ops:
            key = f"{op.kind}:{op.request_id}"
            outcomes = by_key.get(key, [])
            applied = [r for r in journal if r.get("request_id") == op.request_id]
            if op.request_id in compacted_ids:
                applied.append({"request_id": op.request_id, "kind": "compacted"})
            final = [a for a in outcomes if a["outcome"] in ("ok", "rejected", "not-sent")]
            if any(a["outcome"] == "ok" for a in outcomes) and not applied:
                out.append(Violation("acknowledged-input-lost", spec.case_id, f"{op.kind} {op.request_id!r} "
                                     "returned but is not in the journal",
                                     [*outcomes[-3:], *map(_short, journal[-3:])]))
            if len(applied) > 1:
                out.append(Violation("input-applied-twice", spec.case_id, f"request id {op.request_id!r} applied "
                                     f"{len(applied)} times", list(map(_short, applied))))
            if applied and (rejected := [a for a in outcomes if a["outcome"] == "rejected"]):
                out.append(Violation("applied-input-reported-refused", spec.case_id, f"{op.kind} "
                                     f"{op.request_id!r} was answered SignalRejected but the journal applied it",
                                     [*rejected, *map(_short, applied)]))
            if not final:
                out.append(Violation("call-never-acknowledged", spec.case_id, f"{op.kind} {op.request_id!r} never "
                                     "returned after the faults stopped", outcomes[-3:]))
    return out


def _journals(h: History) -> list[Violation]:
    out = []
    for spec in h.specs:
        journal = h.journals.get(spec.case_id)
        if not journal:
            continue
        case = spec.case_id
        seqs = [r.get("seq") for r in journal]
        if seqs != list(range(len(seqs))) and journal[0].get("kind") != "snapshot":
            out.append(Violation("journal-gap", case, f"sequence numbers {seqs[:40]}", []))
        out += _row_in_step(h, case, journal)
        ends = [i for i, r in enumerate(journal) if r.get("kind") == "end"]
        if len(ends) > 1:
            out.append(Violation("case-ended-twice", case, f"{len(ends)} end records",
                                 [_short(journal[i]) for i in ends]))
        if not ends:
            last = [dict(x) for x in h.samples if x["case"] == case][-1:]
            out.append(Violation("case-not-ended", case, f"no end record once the faults stopped (expected "
                                 f"{spec.expect}); the journal's last records and the case row as last sampled "
                                 "follow", [*map(_short, journal[-4:]), *last]))
            continue
        if ends[0] != len(journal) - 1:
            out.append(Violation("record-after-end", case, "records after the end",
                                 list(map(_short, journal[ends[0]:]))))
        outcome = journal[ends[0]].get("outcome")
        if outcome != spec.expect:
            out.append(Violation("wrong-outcome", case, f"ended {outcome!r}, its calls lead to {spec.expect!r}",
                                 [_short(journal[ends[0]])]))
        epochs = list(h.epochs.get(case, ()))
        for (s1, e1), (s2, e2) in zip(epochs, epochs[1:], strict=False):
            if e2 < e1:
                out.append(Violation("epoch-went-back", case, f"record {s2} has epoch {e2} after record {s1}'s "
                                     f"epoch {e1}", [list(p) for p in epochs]))
                break
    return out


def _row_in_step(h: History, case: str, journal: Sequence[Mapping[str, Any]]) -> list[Violation]:
    """The case row's last seq, as last sampled, against the journal read after it: the row is written in the
    transaction of the records that change it, so it can lag only while a write is in flight."""
    last = [x for x in h.samples if x["case"] == case][-1:]
    if not last or "last_seq" not in last[0]:
        return []
    row, final = last[0], journal[-1]
    if row["last_seq"] > final["seq"]:
        return [Violation("row-ahead-of-journal", case, f"the case row names seq {row['last_seq']} but the journal "
                          f"ends at {final['seq']}: records the row counted are gone", [dict(row), _short(final)])]
    if row["last_seq"] < final["seq"] and float(final["time"]) < row["t"] - 2.0:
        return [Violation("row-behind-journal", case, f"the case row still names seq {row['last_seq']} "
                          f"{row['t'] - float(final['time']):.1f} s after the journal's record {final['seq']} "
                          "was appended (state, signals and due time read from it are stale)",
                          [dict(row), _short(final)])]
    return []


def _effects(h: History) -> list[Violation]:
    out = []
    ended_at: dict[str, float] = {}
    for case, journal in h.journals.items():
        for r in journal:
            if r.get("kind") == "end":
                ended_at[case] = float(r["time"])
                break
    for line in h.effects:
        lease = line.get("lease")
        if lease is not None:
            since = lease.get("since_sent")
            if since is None or since > lease["seconds"]:
                out.append(Violation("effect-while-lease-in-doubt", line["case"], f"node {line['node']!r} (pid "
                                     f"{line['pid']}) started attempt {line['attempt']} of {line['key']!r} "
                                     f"{since if since is not None else 'before any'} s after sending its last "
                                     f"successful lease renewal (lease {lease['seconds']} s)", [line]))
        end = ended_at.get(line["case"])
        if end is not None and float(line["t"]) > end + 1.0:
            out.append(Violation("effect-after-end", line["case"], f"node {line['node']!r} started attempt "
                                 f"{line['attempt']} of {line['key']!r} {float(line['t']) - end:.2f} s after the "
                                 "case's end was journaled", [line]))
    return out


def _work_waiting(s: Mapping[str, Any]) -> bool:
    due = s.get("next_due")
    ended = s.get("state") in ("done", "failed", "cancelled")
    return (
        s.get("state") in LIVE_STATES
        or (bool(s.get("calls_done")) and not ended)
        or bool(s.get("effects"))
        or bool(s.get("inbox"))
        or (due is not None and due < s["t"] - DUE_SLACK and not ended)
    )


def _stranded(h: History) -> list[Violation]:
    out = []
    by_case: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for s in sorted(h.samples, key=lambda s: s["t"]):
        by_case[s["case"]].append(s)
    for case, samples in by_case.items():
        since: Mapping[str, Any] | None = None
        for s in samples:
            if not _work_waiting(s) or (since is not None and s.get("last_seq") != since.get("last_seq")):
                since = s if _work_waiting(s) else None
                continue
            if since is None:
                since = s
            elif s["t"] - since["t"] > h.stranded_after:
                out.append(Violation("case-stranded", case, f"work waiting and nothing journaled for "
                                     f"{s['t'] - since['t']:.1f} s (bound {h.stranded_after:.1f} s) after the faults "
                                     f"stopped; owner {s.get('owner')!r} (lease live: {s.get('owner_live')})",
                                     [dict(since), dict(s)]))
                break
    return out


def summarize(violations: Iterable[Violation]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for v in violations:
        counts[v.kind] += 1
    return dict(sorted(counts.items()))

"""The chaos campaign: several wfsub nodes on a private Postgres server behind TCP proxies, a SQLite owner and an
outside writer of its inbox, a workload of sagas, timers, multiple instances, evictions and client calls with
request ids, and faults chosen by a seeded RNG; then the checker (`_checker`) over what the stores hold.

    result = run(Settings(seed=7, fault_seconds=30, quiet_seconds=30))
    print(result.report)          # the seed, the schedule, what ran when, each violation with its records

The seed fixes the fault schedule (kinds, targets, times, durations) and the plan (cases, their data and calls):
`schedule(settings)` gives the same list for the same seed. Where a fault lands in the cases' runs depends on
timing as well, so a seed reproduces the faults, and usually what they hit.

Faults (the schedule's kinds):

    kill        SIGKILL a node; it comes back after `duration` s, as the same node id or a new one (`arg`)
    stop        SIGSTOP a node for `duration` s (past its lease): the others take its cases over while it sleeps
    restart     crash the Postgres server (stop -m immediate), start it again after `duration` s (some
                outages outlast the store's retry window: calls made meanwhile fail and are made again)
    cut         a node's proxy drops every connection and refuses new ones for `duration` s
    drop        a node's proxy swallows the next `arg` answers from the server, resetting their connections
    lose-commit the same for answers to requests of 400 bytes or more: writes (journal appends, inbox inputs),
                whose answer says whether they committed
    delay       a node's proxy holds each answer `arg` ms, for `duration` s
    sqlite-kill SIGKILL the SQLite owner; it comes back after `duration` s
    sqlite-full the SQLite owner's file size limit (RLIMIT_FSIZE) is set just above its files' sizes for
                `duration` s: its writes fail as on a full disk, while the outside writer's inbox rows still land
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import anyio

from wfsub.stores import Listing, PostgresStore, SqliteStore, Store

from ..stores._proxy import Proxy
from ._checker import History, Violation, check, summarize
from ._node import OPEN_FAILED
from ._server import PrivateServer
from ._workload import CaseSpec, plan

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "chaos"
ACKED = {"ok", "rejected", "refused", "not-sent"}  # the outcomes after which a client does not call again


@dataclass
class Settings:
    seed: int
    fault_seconds: float = 30.0  # faults are injected for this long
    quiet_seconds: float = 40.0  # then, at most this long for the workload to finish
    nodes: int = 3
    cases_per_node: int = 0  # 0: one case per second of faults per node
    sqlite_cases: int = 0  # 0: one per 2 s of faults
    lease: float = 2.0
    retry_for: float = 6.0
    evict_after: float = 1.0
    workdir: Path | None = None  # None: a temporary directory, removed unless the run fails
    keep: bool = False
    echo: TextIO | None = None  # progress lines as they happen (the report has them all)

    @property
    def stranded_after(self) -> float:
        return self.lease + self.retry_for + 2.0  # + the monitor's sampling and a case's own steps


@dataclass(frozen=True)
class Fault:
    at: float
    kind: str
    target: int
    duration: float
    arg: int = 0

    def __str__(self) -> str:
        where = "" if self.kind in ("restart", "sqlite-kill", "sqlite-full") else f" node{self.target}"
        extra = {"kill": f" back as {'the same id' if self.arg else 'a new id'}", "drop": f" {self.arg} answers",
                 "lose-commit": f" {self.arg} answers to writes",
                 "delay": f" {self.arg} ms"}.get(self.kind, "")
        return f"t={self.at:6.2f}s {self.kind:<11}{where}{extra} for {self.duration:.2f}s"


KINDS = ["kill", "stop", "restart", "cut", "drop", "lose-commit", "delay", "sqlite-kill", "sqlite-full"]
WEIGHTS = [3, 3, 2, 2, 2, 3, 2, 2, 2]


def schedule(s: Settings) -> list[Fault]:
    """The faults of a run, from its seed alone."""
    rng = random.Random(s.seed)
    out = []
    t = rng.uniform(1.0, 3.0)
    while t < s.fault_seconds - 1.0:
        kind = rng.choices(KINDS, WEIGHTS)[0]
        target = rng.randrange(s.nodes)
        arg = 0
        if kind == "kill":
            duration, arg = rng.uniform(0.3, 3.0), rng.randrange(2)
        elif kind == "stop":
            duration = rng.uniform(1.5 * s.lease, 3.0 * s.lease)
        elif kind == "restart":  # mostly short; some outlast the store's retry window, so calls fail
            duration = rng.uniform(0.0, 3.0) if rng.random() < 0.7 else rng.uniform(s.retry_for, s.retry_for + 3.0)
        elif kind == "cut":
            duration = rng.uniform(0.3, 2.0 * s.lease) if rng.random() < 0.7 else rng.uniform(s.retry_for,
                                                                                               s.retry_for + 3.0)
        elif kind == "drop":
            duration, arg = 0.0, rng.randint(1, 4)
        elif kind == "lose-commit":
            duration, arg = 0.0, rng.randint(1, 3)
        elif kind == "delay":
            duration, arg = rng.uniform(1.0, 4.0), rng.randint(100, 1500)
        elif kind == "sqlite-kill":
            duration = rng.uniform(0.3, 2.0)
        else:
            duration = rng.uniform(2.0, 6.0)
        out.append(Fault(round(t, 2), kind, target, round(duration, 2), arg))
        t += rng.uniform(0.8, 3.5)
    return out


def plans(s: Settings) -> tuple[list[CaseSpec], list[CaseSpec]]:
    per_node = s.cases_per_node or max(4, int(s.fault_seconds))
    sqlite = s.sqlite_cases or max(4, int(s.fault_seconds / 2))
    spread = max(1.0, s.fault_seconds - 4.0)
    return plan(s.seed, "p", per_node * s.nodes, s.nodes, spread), plan(s.seed, "s", sqlite, 1, spread)


@dataclass
class Result:
    settings: Settings
    faults: list[Fault]
    violations: list[Violation]
    report: str
    workdir: Path

    @property
    def ok(self) -> bool:
        return not self.violations


class _Proc:
    """One process of the campaign (a node, the SQLite owner or its client), its incarnations, and its lines."""

    def __init__(self, campaign: _Run, name: str, config: dict[str, Any]) -> None:
        self.campaign = campaign
        self.name = name
        self.config = config
        self.popen: subprocess.Popen[bytes] | None = None
        self.state = "dead"  # running | stopped | dead
        self.incarnation = 0
        self.done = False  # the current incarnation printed workload_done

    def start(self, **changes: Any) -> None:
        self.config.update(changes)
        self.config["skip"] = sorted(self.campaign.acked(self.name))
        self.incarnation += 1
        self.done = False
        path = self.campaign.dir / f"{self.name}.{self.incarnation}.json"
        path.write_text(json.dumps(self.config))
        err = (self.campaign.dir / f"{self.name}.{self.incarnation}.err").open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos._node", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=err, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        err.close()
        self.state = "running"
        threading.Thread(target=self._read, args=(self.popen, self.incarnation), daemon=True).start()

    def _read(self, popen: subprocess.Popen[bytes], incarnation: int) -> None:
        assert popen.stdout is not None
        for raw in popen.stdout:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            line["src"] = self.name
            line["inc"] = incarnation
            if line.get("ev") == "workload_done" and incarnation == self.incarnation:
                self.done = True
            self.campaign.record(line)

    def signal(self, sig: int) -> bool:
        if self.popen is None or self.popen.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)
        return True

    def kill(self) -> None:
        if self.signal(signal.SIGKILL) and self.popen is not None:
            self.popen.wait()
        self.state = "dead"

    def reap(self) -> bool:
        """True (once) if the process ended by itself since it started: a crash, not one of the faults."""
        if self.popen is None or self.state == "dead" or self.popen.poll() is None:
            return False
        self.state = "dead"
        if self.popen.returncode == OPEN_FAILED:  # it printed why (an `open-failed` line, judged by the checker)
            return True
        err = self.campaign.dir / f"{self.name}.{self.incarnation}.err"
        tail = err.read_text(errors="replace")[-3000:] if err.exists() else ""
        self.campaign.record({"ev": "exit", "src": self.name, "inc": self.incarnation, "rc": self.popen.returncode,
                              "stderr": crash_lines(tail)})
        return True

    def stop_cleanly(self) -> None:
        if self.popen is None:
            return
        self.signal(signal.SIGCONT)
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()
        self.state = "dead"


_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception|ExceptionGroup|Exit):")


def crash_lines(stderr: str) -> list[str]:
    """What a traceback says in brief: each exception line, and the last wfsub frames (file, line, function)."""
    lines = [ln.strip().lstrip("|").strip() for ln in stderr.splitlines()]
    frames = [ln for ln in lines if ln.startswith("File ") and "/wfsub/" in ln]
    errors = [ln for ln in lines if _EXCEPTION.match(ln)]
    return [*frames[-4:], *errors[-6:]]


class _Run:
    def __init__(self, s: Settings, dir: Path) -> None:
        self.s = s
        self.dir = dir
        self.lines: list[dict[str, Any]] = []
        self.log: list[str] = []
        self._lock = threading.Lock()
        self._history = (dir / "history.jsonl").open("a", encoding="utf-8")
        self.start = time.monotonic()

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.start:7.2f}s] {text}"
        self.log.append(line)
        if self.s.echo is not None:
            print(line, file=self.s.echo, flush=True)

    def record(self, line: dict[str, Any]) -> None:
        with self._lock:
            self.lines.append(line)
            self._history.write(json.dumps(line, separators=(",", ":")) + "\n")
            self._history.flush()

    def acked(self, source: str) -> set[str]:
        with self._lock:
            return {ln["key"] for ln in self.lines
                    if ln.get("ev") == "ack" and ln["src"] == source and ln["outcome"] in ACKED}


def run(s: Settings) -> Result:
    """One campaign run; never raises for what it finds (the violations are in the result)."""
    # The checker's own store connections see the server crash too: their driver's complaints are not findings.
    logging.getLogger("asyncpg").setLevel(logging.CRITICAL)
    logging.getLogger("wfsub").setLevel(logging.CRITICAL)
    workdir = s.workdir or Path(tempfile.mkdtemp(prefix=f"wfsub-chaos-{s.seed}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    faults = schedule(s)
    r = _Run(s, workdir)
    pg_specs, sqlite_specs = plans(s)
    header = [
        f"chaos campaign: seed {s.seed}, {s.fault_seconds:g} s of faults then at most {s.quiet_seconds:g} s to "
        f"finish; {s.nodes} Postgres nodes (lease {s.lease:g} s, retry_for {s.retry_for:g} s, evict_after "
        f"{s.evict_after:g} s), {len(pg_specs)} Postgres cases, {len(sqlite_specs)} SQLite cases",
        f"reproduce: make chaos SEED={s.seed} MINUTES={(s.fault_seconds + s.quiet_seconds) / 60:g}",
        f"work directory: {workdir}",
        "schedule:",
        *[f"  {f}" for f in faults],
    ]
    for line in header:
        r.say(line)
    violations: list[Violation] = []
    server = PrivateServer.start(workdir)
    try:
        violations = anyio.run(_campaign, r, server, faults, pg_specs, sqlite_specs)
    finally:
        server.stop()
    counts = summarize(violations)
    verdict = ("FAILED: " + ", ".join(f"{k} x{n}" for k, n in counts.items())) if violations else "passed"
    report = "\n".join([*r.log, *[v.render() for v in violations],
                        f"seed {s.seed}: {verdict} (reproduce: make chaos SEED={s.seed} "
                        f"MINUTES={(s.fault_seconds + s.quiet_seconds) / 60:g})"])
    (workdir / "report.txt").write_text(report + "\n")
    if not violations and not s.keep and s.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:  # the server's log is kept, its data files (tens of MB) are not: stores.json has what the checker read
        with contextlib.suppress(OSError):
            shutil.move(str(server.directory / "server.log"), str(workdir / "server.log"))
        shutil.rmtree(server.directory, ignore_errors=True)
    return Result(s, faults, violations, report, workdir)


async def _campaign(r: _Run, server: PrivateServer, faults: list[Fault], pg_specs: list[CaseSpec],
                    sqlite_specs: list[CaseSpec]) -> list[Violation]:
    s = r.s
    pg_reader = PostgresStore(server.dsn, schema=SCHEMA, lease_seconds=s.lease, retry_for=s.retry_for)
    await pg_reader.open(owner=False, owner_id="chaos-checker")  # creates the schema before the nodes come
    sqlite_path = r.dir / "chaos.db"
    proxies = [Proxy(server.dsn) for _ in range(s.nodes)]
    go = str(r.dir / "go")  # the plan's times count from the time written there, once every process is ready
    pgs = [
        _Proc(r, f"pg{k}", {"mode": "pg", "dsn": proxies[k].dsn, "schema": SCHEMA, "node_id": f"n{k}", "index": k,
                            "lease": s.lease, "retry_for": s.retry_for, "evict_after": s.evict_after, "go": go,
                            "specs": [c.to_json() for c in pg_specs]})
        for k in range(s.nodes)
    ]
    sqlite_owner = _Proc(r, "sqlite", {"mode": "sqlite", "path": str(sqlite_path), "evict_after": s.evict_after,
                                        "go": go, "specs": [c.to_json() for c in sqlite_specs]})
    sqlite_client = _Proc(r, "sqlite-client", {"mode": "sqlite-client", "path": str(sqlite_path), "go": go,
                                                "specs": [c.to_json() for c in sqlite_specs]})
    procs = [*pgs, sqlite_owner, sqlite_client]
    sqlite_reader: Store | None = None
    try:
        for proc in [*pgs, sqlite_owner]:
            proc.start()
        await _until_ready(r, [*pgs, sqlite_owner])
        sqlite_client.start()
        await anyio.Path(go).write_text(str(time.time()))
        sqlite_reader = SqliteStore(str(sqlite_path))
        await sqlite_reader.open(owner=False, owner_id="chaos-checker")
        r.say("faults start")
        await _inject(r, server, proxies, pgs, sqlite_owner, faults)
        r.say("faults stop: healing (SIGCONT, proxies up, server up, dead processes restarted, file limit lifted)")
        await _heal(r, server, proxies, pgs, sqlite_owner)
        samples = await _quiet(r, pg_reader, sqlite_reader, procs, pg_specs, sqlite_specs)
        r.say("reading the journals")
        journals, epochs = await _journals(pg_reader, sqlite_reader, pg_specs, sqlite_specs)
    finally:
        for proc in procs:
            proc.reap()  # a crash since the last look is reported too
            proc.stop_cleanly()
        for proxy in proxies:
            proxy.down()
        await pg_reader.close()
        if sqlite_reader is not None:
            await sqlite_reader.close()
    stored = {"specs": [c.to_json() for c in [*pg_specs, *sqlite_specs]], "journals": journals, "epochs": epochs,
              "samples": samples, "lease_seconds": s.lease, "stranded_after": s.stranded_after}
    await anyio.Path(r.dir / "stores.json").write_text(json.dumps(stored, default=str))
    history = load_history(r.dir)
    violations = check(history)
    acked = sum(1 for ln in history.acks if ln["outcome"] == "ok")
    errors = sum(1 for ln in history.acks if ln["outcome"] == "error")
    r.say(f"checked {len(history.specs)} cases, {acked} acknowledged calls ({errors} errors made again), "
          f"{len(history.effects)} effect attempts, {len(samples)} row samples: {len(violations)} violations")
    return violations


def load_history(workdir: Path) -> History:
    """A run's history from its work directory: `history.jsonl` (the processes' lines) and `stores.json` (what the
    stores held once faults stopped), so a kept run can be checked again (`python -m tests.chaos --check DIR`)."""
    stored = json.loads((workdir / "stores.json").read_text())
    with (workdir / "history.jsonl").open(encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    return History(
        specs=[CaseSpec.from_json(c) for c in stored["specs"]],
        exits=[ln for ln in lines if ln.get("ev") == "exit"],
        open_failures=[ln for ln in lines if ln.get("ev") == "open-failed"],
        acks=[ln for ln in lines if ln.get("ev") == "ack"],
        journals=stored["journals"], epochs={k: [tuple(p) for p in v] for k, v in stored["epochs"].items()},
        effects=[ln for ln in lines if ln.get("ev") == "effect"],
        samples=stored["samples"], lease_seconds=stored["lease_seconds"], stranded_after=stored["stranded_after"],
    )


async def _until_ready(r: _Run, procs: list[_Proc], within: float = 90.0) -> None:
    deadline = time.monotonic() + within
    while True:
        ready = {(ln["src"], ln["inc"]) for ln in list(r.lines) if ln.get("ev") == "ready"}
        if all((p.name, p.incarnation) in ready for p in procs):
            return
        for p in procs:
            if p.popen is not None and p.popen.poll() is not None:
                raise RuntimeError(f"{p.name} exited with {p.popen.returncode} before it was ready: see "
                                   f"{r.dir / f'{p.name}.{p.incarnation}.err'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes not ready after {within:g} s: see the .err files in {r.dir}")
        await anyio.sleep(0.1)


async def _inject(r: _Run, server: PrivateServer, proxies: list[Proxy], pgs: list[_Proc], sqlite: _Proc,
                  faults: list[Fault]) -> None:
    """Run the schedule: each fault at its time, and its end `duration` later (events in time order)."""
    events: list[tuple[float, int, str, Fault]] = []
    for i, f in enumerate(faults):
        events.append((f.at, 2 * i, "begin", f))
        if f.duration > 0:
            events.append((f.at + f.duration, 2 * i + 1, "end", f))
    events.sort()
    begin = time.monotonic()
    server_down = 0
    new_ids = 0
    limit_on = 0
    cuts = [0] * len(proxies)
    for at, _, phase, f in events:
        await anyio.sleep(max(0.0, begin + at - time.monotonic()))
        _restart_crashed(r, [*pgs, sqlite])
        node = pgs[f.target]
        proxy = proxies[f.target]
        what = f"{phase} {f}"
        if f.kind == "kill":
            if phase == "begin":
                node.signal(signal.SIGCONT)
                node.kill()
            elif node.state == "dead":
                new_ids += 1
                node_id = node.config["node_id"] if f.arg else f"n{f.target}x{new_ids}"
                node.start(node_id=node_id)
                what += f" (as {node_id})"
        elif f.kind == "stop":
            if phase == "begin" and node.state == "running":
                node.signal(signal.SIGSTOP)
                node.state = "stopped"
            elif phase == "end" and node.state == "stopped":
                node.signal(signal.SIGCONT)
                node.state = "running"
            else:
                what += f" (skipped: the node is {node.state})"
        elif f.kind == "restart":
            if phase == "begin":
                server_down += 1
                if server_down == 1:
                    await anyio.to_thread.run_sync(server.crash)
            else:
                server_down -= 1
                if server_down == 0:
                    await anyio.to_thread.run_sync(server.start_again)
        elif f.kind == "cut":  # cuts of one node may overlap: it is back when the last one ends
            cuts[f.target] += 1 if phase == "begin" else -1
            if phase == "begin":
                proxy.down()
            elif cuts[f.target] == 0:
                proxy.up()
        elif f.kind == "drop":
            proxy.drop_answers(f.arg)
        elif f.kind == "lose-commit":
            proxy.drop_answers(f.arg, after=400)
        elif f.kind == "delay":
            proxy.delay = f.arg / 1000 if phase == "begin" else 0.0
        elif f.kind == "sqlite-kill":
            if phase == "begin":
                sqlite.kill()
            elif sqlite.state == "dead":
                sqlite.start()
        elif f.kind == "sqlite-full":
            if phase == "begin":
                limit_on += 1
                what += _limit(r, sqlite, True)
            else:
                limit_on -= 1
                if limit_on == 0:
                    what += _limit(r, sqlite, False)
        r.say(what)


def _limit(r: _Run, proc: _Proc, on: bool) -> str:
    """Set (or lift) the SQLite owner's file size limit just above its files' sizes: a full disk to it."""
    if proc.popen is None or proc.popen.poll() is not None:
        return " (skipped: the owner is dead)"
    if not on:
        resource.prlimit(proc.popen.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        return " (limit lifted)"
    sizes = [p.stat().st_size for p in r.dir.glob("chaos.db*") if p.is_file()]
    limit = max(sizes, default=0) + 4096
    resource.prlimit(proc.popen.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return f" (limit {limit} bytes)"


def _restart_crashed(r: _Run, procs: list[_Proc]) -> None:
    """A process that ended by itself (the checker reports it) is started again, as a supervisor would."""
    for proc in procs:
        if proc.reap():
            assert proc.popen is not None
            r.say(f"{proc.name} (incarnation {proc.incarnation}) exited by itself with status "
                  f"{proc.popen.returncode}: started again")
            proc.start()


async def _heal(r: _Run, server: PrivateServer, proxies: list[Proxy], pgs: list[_Proc], sqlite: _Proc) -> None:
    _restart_crashed(r, [*pgs, sqlite])
    with contextlib.suppress(RuntimeError):  # already running
        await anyio.to_thread.run_sync(server.start_again)
    for proxy in proxies:
        proxy.clear()  # answers still armed to be dropped are not: the faults are over
        proxy.down()
        proxy.up()
    for node in pgs:
        if node.state == "stopped":
            node.signal(signal.SIGCONT)
            node.state = "running"
        elif node.state == "dead":
            node.start()
            r.say(f"heal: {node.name} started again as {node.config['node_id']}")
    if sqlite.state == "dead":
        sqlite.start()
        r.say("heal: the SQLite owner started again")
    else:
        _limit(r, sqlite, False)


ENDED = {"done", "failed", "cancelled"}


async def _sample(store: Store, t: float, wanted: set[str], live: set[str] | None, calls_done: set[str]
                  ) -> list[dict[str, Any]]:
    rows = await store.cases(Listing(limit=100_000))
    inbox: dict[str, int] = {}
    for row in await store.inbox_take(0, 100_000):
        inbox[row.case_id] = inbox.get(row.case_id, 0) + 1
    out = []
    for row in rows:
        if row.case_id not in wanted:
            continue
        out.append({"t": t, "case": row.case_id, "state": row.state, "last_seq": row.last_seq, "owner": row.owner,
                    "epoch": row.epoch, "effects": len(row.effects), "next_due": row.next_due,
                    "inbox": inbox.get(row.case_id, 0), "calls_done": row.case_id in calls_done,
                    "owner_live": None if live is None else row.owner in live})
    return out


def _calls_done(r: _Run, specs: list[CaseSpec]) -> set[str]:
    """The cases whose every planned call (start included) was acknowledged."""
    with r._lock:
        acked = {ln["key"] for ln in r.lines if ln.get("ev") == "ack" and ln["outcome"] == "ok"}
    return {c.case_id for c in specs
            if f"start:{c.case_id}" in acked and all(f"{op.kind}:{op.request_id}" in acked for op in c.ops)}


async def _quiet(r: _Run, pg: PostgresStore, sqlite: Store, procs: list[_Proc], pg_specs: list[CaseSpec],
                 sqlite_specs: list[CaseSpec]) -> list[dict[str, Any]]:
    """Sample every case row each second until the workload is done and every case ended (or the bound)."""
    s = r.s
    samples: list[dict[str, Any]] = []
    pg_ids = {c.case_id for c in pg_specs}
    sqlite_ids = {c.case_id for c in sqlite_specs}
    deadline = time.monotonic() + s.quiet_seconds
    last_note = 0.0
    while time.monotonic() < deadline:
        _restart_crashed(r, procs)
        try:
            now = await pg.database_time()
            live = {o.owner_id for o in await pg.nodes()}
            done = _calls_done(r, [*pg_specs, *sqlite_specs])
            got = await _sample(pg, now, pg_ids, live, done)
            got += await _sample(sqlite, time.time(), sqlite_ids, None, done)
        except Exception as exc:
            r.say(f"monitor: could not read the stores ({type(exc).__name__}: {exc})")
            await anyio.sleep(1.0)
            continue
        samples += got
        ended = sum(1 for x in got if x["state"] in ENDED)
        workload = all(p.done for p in procs)
        total = len(pg_ids) + len(sqlite_ids)
        if workload and ended == total:
            r.say(f"quiet: the workload is done and all {total} cases ended")
            return samples
        if time.monotonic() - last_note > 5.0:
            last_note = time.monotonic()
            waiting = [p.name for p in procs if not p.done]
            r.say(f"quiet: {ended}/{total} cases ended; clients still calling: {', '.join(waiting) or 'none'}")
        await anyio.sleep(1.0)
    r.say(f"quiet: gave up waiting after {s.quiet_seconds:g} s")
    return samples


async def _journals(pg: PostgresStore, sqlite: Store, pg_specs: list[CaseSpec], sqlite_specs: list[CaseSpec]
                    ) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[tuple[int, int]]]]:
    journals: dict[str, list[dict[str, Any]]] = {}
    epochs: dict[str, list[tuple[int, int]]] = {}
    for spec in pg_specs:
        journals[spec.case_id] = [dict(x) for x in await pg.journal(spec.case_id)]
        epochs[spec.case_id] = await pg.journal_epochs(spec.case_id)
    for spec in sqlite_specs:
        journals[spec.case_id] = [dict(x) for x in await sqlite.journal(spec.case_id)]
    return journals, epochs

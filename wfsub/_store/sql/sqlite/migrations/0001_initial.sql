-- Migration 1: an empty file (user_version 0) to layout version 1, the first layout.
--
-- The migrations are the only description of the layout: a new file is built by running them all in order
-- (one path to build a layout, the one that is tested). Never edit a migration that was released: add the next
-- numbered file instead. The store sets `PRAGMA application_id` and `user_version` itself, not here; every
-- statement it runs afterwards is in ../queries.sql.

-- One row per case: what the case is doing (`CaseRow`), replaced in the same transaction as its records.
CREATE TABLE cases (
    case_order  INTEGER PRIMARY KEY AUTOINCREMENT,  -- `CaseRow.order`: assigned at insert, never reused
    case_id     TEXT NOT NULL UNIQUE,
    workflow    TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    state       TEXT NOT NULL,
    started_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    ended_at    REAL,
    last_seq    INTEGER NOT NULL,
    next_due    REAL,
    live        INTEGER NOT NULL,  -- 1: initializing, running, waiting_effect, or effects in flight
    parked      INTEGER NOT NULL,  -- 1: waiting_signal or waiting_timer with no effect in flight
    detail      TEXT NOT NULL      -- JSON: at, signals, effects, timers, data, error, cancel_reason, suspended_reason
);
CREATE INDEX cases_by_state ON cases (state, case_order);
CREATE INDEX cases_by_workflow ON cases (workflow, case_order);
CREATE INDEX cases_live ON cases (case_order) WHERE live = 1;
CREATE INDEX cases_due ON cases (next_due) WHERE parked = 1 AND next_due IS NOT NULL;
CREATE INDEX cases_ended ON cases (ended_at) WHERE ended_at IS NOT NULL;

-- The journal: every record of every case, clustered by case and in seq order. Only `seq`, `kind` and
-- `request_id` are read out of a record; the record itself is kept whole as JSON text.
CREATE TABLE journal (
    case_id    TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    request_id TEXT,
    record     TEXT NOT NULL,
    PRIMARY KEY (case_id, seq)
) WITHOUT ROWID;
-- A retried input applies once: its request_id is unique within its case.
CREATE UNIQUE INDEX journal_request ON journal (case_id, request_id) WHERE request_id IS NOT NULL;
-- A case ends once.
CREATE UNIQUE INDEX journal_one_end ON journal (case_id) WHERE kind = 'end';

-- Machine snapshots; the store keeps the newest two per case.
CREATE TABLE snapshots (
    case_id  TEXT NOT NULL,
    seq      INTEGER NOT NULL,  -- taken after the record `seq` was applied
    format   INTEGER NOT NULL,
    bytecode INTEGER NOT NULL,
    state    TEXT NOT NULL,     -- JSON: `Machine.snapshot()`
    PRIMARY KEY (case_id, seq)
) WITHOUT ROWID;

-- Inputs written by anyone but the owner, until the owner moves them into a journal (or refuses them).
CREATE TABLE inbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,  -- increasing, never reused: the inbox's order
    case_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    body       TEXT NOT NULL,  -- JSON
    request_id TEXT,
    created_at REAL NOT NULL,
    refused    TEXT            -- why the owner refused it (the row stays, marked)
);
CREATE INDEX inbox_pending ON inbox (id) WHERE refused IS NULL;
CREATE INDEX inbox_by_case ON inbox (case_id);

-- The Substrate that owns the file now (or last did). The OS lock on the file's `-lock` neighbour is what
-- makes ownership exclusive; this row says who holds it, for messages and for `wfsub`.
CREATE TABLE owner (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    owner_id  TEXT NOT NULL,
    pid       INTEGER NOT NULL,
    host      TEXT NOT NULL,
    epoch     INTEGER NOT NULL,  -- 1 for the first owner, +1 at each new owner
    since     REAL NOT NULL,
    heartbeat REAL NOT NULL
);

-- Migration 2: program summaries, and cases queued for the owner by other processes.
--
-- A process that does not own the file (a standby Substrate, a `wfsub.Client`) starts a case by writing its
-- `start` record and a row marked `queued`; the owner claims it (clears the mark, marks it live) and runs it.

ALTER TABLE cases ADD COLUMN queued INTEGER NOT NULL DEFAULT 0;  -- 1: written by another process, not claimed yet
CREATE INDEX cases_queued ON cases (case_order) WHERE queued = 1;

-- What each registered program version can take, written once per fingerprint by the Substrate that registers
-- it: the command, a client and a standby check an input against it before writing it to the inbox.
CREATE TABLE programs (
    fingerprint   TEXT PRIMARY KEY,
    workflow      TEXT NOT NULL,
    summary       TEXT NOT NULL,  -- JSON: {"signals": {name: schema or null}, "updates": {...}, "regions": {...}}
    program_order INTEGER NOT NULL,  -- registration order: the newest version of a workflow has the highest
    registered_at REAL NOT NULL
);
CREATE INDEX programs_by_workflow ON programs (workflow, program_order);

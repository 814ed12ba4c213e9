-- Migration 2: program summaries.
--
-- What each registered program version can take, written once per fingerprint by the Substrate that registers
-- it: the command, a client and a standby check an input against it before writing it to the inbox.
CREATE TABLE programs (
    fingerprint   text PRIMARY KEY,
    workflow      text NOT NULL,
    summary       text NOT NULL,  -- JSON: {"signals": {name: schema or null}, "updates": {...}, "regions": {...}}
    program_order bigint GENERATED ALWAYS AS IDENTITY,  -- registration order: the newest version has the highest
    registered_at double precision NOT NULL
);
CREATE INDEX programs_by_workflow ON programs (workflow, program_order);

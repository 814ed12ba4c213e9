-- Migration 3: schedules.
--
-- One row per schedule a node registered (`Substrate(schedules=[...])`): its newest registration, the newest slot
-- it has dealt with and the case it started last. Every node runs every schedule it registers; a slot's case id is
-- made from the slot, so two nodes starting it start one case, and `last_slot` only moves forward.
CREATE TABLE schedules (
    name       text PRIMARY KEY,
    spec       text NOT NULL,  -- JSON: {"workflow", "cron", "every", "tz", "overlap", "catchup", "queue"}
    last_slot  double precision,  -- seconds since the epoch of the newest slot dealt with (NULL: none yet)
    last_case  text,  -- the case it started last
    paused     boolean NOT NULL DEFAULT false,
    updated_at double precision NOT NULL
);

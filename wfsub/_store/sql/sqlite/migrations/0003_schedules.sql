-- Migration 3: schedules.
--
-- One row per schedule a Substrate registered (`Substrate(schedules=[...])`): its newest registration, the newest
-- slot it has dealt with and the case it started last, so slots missed while no process ran are caught up as
-- its `catchup=` says, and a slot is dealt with once across restarts.
CREATE TABLE schedules (
    name       TEXT PRIMARY KEY,
    spec       TEXT NOT NULL,  -- JSON: {"workflow", "cron", "every", "tz", "overlap", "catchup", "queue"}
    last_slot  REAL,  -- seconds since the epoch of the newest slot dealt with (NULL: none yet)
    last_case  TEXT,  -- the case it started last
    paused     INTEGER NOT NULL DEFAULT 0,
    updated_at REAL NOT NULL
);

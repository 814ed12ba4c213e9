-- Migration 5: the last heartbeat of each in-flight effect, kept beside the case row.
--
-- JSON {effect id: {"details", "at", "attempt"}}, written by the owner (throttled, see wfsub._runtime._heartbeat),
-- never journaled: recovery gives the details to the effect's next attempt (`effect_info().heartbeat`).

ALTER TABLE cases ADD COLUMN heartbeats text;

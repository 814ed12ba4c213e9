-- Every statement the SQLite store runs, by name. `-- name: NAME` starts a query; the comment lines right
-- after it say what it does. Values are always bound parameters (`:name`). PRAGMAs take no parameters: their
-- values are fixed here, except the two header values a new or migrated file gets (`application_id`,
-- `user_version`), which `_sqlite.py` formats from int constants.
-- Parsed once, when `wfsub._store._sql` is imported.

-- name: begin_write
-- A write transaction: takes the file's write lock at once (a busy file fails here, before any work).
BEGIN IMMEDIATE;

-- name: begin_read
-- A read transaction: the reads inside it see one committed state (WAL: beside the writer, never blocking it).
BEGIN DEFERRED;

-- name: commit
COMMIT;

-- name: rollback
ROLLBACK;

-- name: savepoint
-- One write of a group redone one at a time (after one broke a rule in the batched pass): its own savepoint,
-- so the write that breaks a rule is undone alone.
SAVEPOINT one_write;

-- name: savepoint_undo
-- Undo the one write (the transaction and the other writes of the group go on).
ROLLBACK TO one_write;

-- name: savepoint_release
RELEASE one_write;

-- name: pragma_wal
-- Journal mode WAL: readers never block the writer, one fsync per commit. Persistent in the file.
PRAGMA journal_mode = WAL;

-- name: pragma_synchronous_full
-- Sync the WAL at every commit: a committed write survives a process crash and a power loss.
PRAGMA synchronous = FULL;

-- name: pragma_synchronous_normal
-- Sync the WAL only at checkpoints: a committed write survives a process crash, not a power loss.
PRAGMA synchronous = NORMAL;

-- name: pragma_query_only
-- Reader connections refuse to write.
PRAGMA query_only = 1;

-- name: pragma_application_id
-- Whose file this is (0 for a new file).
PRAGMA application_id;

-- name: pragma_user_version
-- The layout version of the file (0 for a new file).
PRAGMA user_version;

-- name: pragma_data_version
-- Changes when another connection commits: `changed()`.
PRAGMA data_version;

-- name: schema_names
-- The names of what the file holds (a new file holds nothing): a store missing one of its tables is refused.
SELECT name FROM sqlite_master;

-- name: owner_get
-- Who owns the file now (or last did).
SELECT owner_id, pid, host, epoch, since, heartbeat FROM owner WHERE id = 1;

-- name: owner_take
-- Become the owner: a new epoch.
INSERT INTO owner (id, owner_id, pid, host, epoch, since, heartbeat)
VALUES (1, :owner_id, :pid, :host, 1, :now, :now)
ON CONFLICT (id) DO UPDATE SET
    owner_id = excluded.owner_id, pid = excluded.pid, host = excluded.host, epoch = owner.epoch + 1,
    since = excluded.since, heartbeat = excluded.heartbeat;

-- name: queue_items_follow_owner
-- A new owner runs every case of the file: the started items of queues are its own from now on (per_node counts
-- them as this node's), in the transaction that makes it the owner.
UPDATE queue_items SET node = :owner_id WHERE state = 'started';

-- name: owner_heartbeat
-- The owner is alive.
UPDATE owner SET heartbeat = :now WHERE id = 1 AND epoch = :epoch;

-- name: record_append
-- Append one record (a group's records: one executemany); a record whose request_id this case's journal already
-- holds is skipped (no row).
INSERT INTO journal (case_id, seq, kind, request_id, record)
VALUES (:case_id, :seq, :kind, :request_id, :record)
ON CONFLICT (case_id, request_id) WHERE request_id IS NOT NULL DO NOTHING;

-- name: records_append
-- A group's records in one statement: a JSON array of [case_id, seq, kind, request_id, record] (one sqlite3 call
-- however many records; `record_append` for each, in order). `WHERE true` tells the parser that ON CONFLICT is
-- the upsert's, not a join's.
INSERT INTO journal (case_id, seq, kind, request_id, record)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4 FROM json_each(:records) WHERE true
ON CONFLICT (case_id, request_id) WHERE request_id IS NOT NULL DO NOTHING;

-- name: case_put
-- Insert or replace a case row; `case_order` is assigned at the insert and kept by every replace.
INSERT INTO cases (case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due,
                   live, parked, detail)
VALUES (:case_id, :workflow, :fingerprint, :state, :started_at, :updated_at, :ended_at, :last_seq, :next_due,
        :live, :parked, :detail)
ON CONFLICT (case_id) DO UPDATE SET
    workflow = excluded.workflow, fingerprint = excluded.fingerprint, state = excluded.state,
    started_at = excluded.started_at, updated_at = excluded.updated_at, ended_at = excluded.ended_at,
    last_seq = excluded.last_seq, next_due = excluded.next_due, live = excluded.live, parked = excluded.parked,
    detail = excluded.detail;

-- name: cases_put
-- A group's case rows in one statement: a JSON array of rows, each its `case_put` columns in that order (one
-- sqlite3 call however many rows; `case_put` for each, in order, so the last row of a case wins).
INSERT INTO cases (case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due,
                   live, parked, detail)
SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, value ->> 5, value ->> 6, value ->> 7,
       value ->> 8, value ->> 9, value ->> 10, value ->> 11
FROM json_each(:rows) WHERE true
ON CONFLICT (case_id) DO UPDATE SET
    workflow = excluded.workflow, fingerprint = excluded.fingerprint, state = excluded.state,
    started_at = excluded.started_at, updated_at = excluded.updated_at, ended_at = excluded.ended_at,
    last_seq = excluded.last_seq, next_due = excluded.next_due, live = excluded.live, parked = excluded.parked,
    detail = excluded.detail;

-- name: snapshot_put
-- Store a snapshot (a second one at the same seq replaces the first).
INSERT OR REPLACE INTO snapshots (case_id, seq, format, bytecode, state)
VALUES (:case_id, :seq, :format, :bytecode, :state);

-- name: snapshot_trim
-- Keep the newest `:keep` snapshots of a case.
DELETE FROM snapshots
WHERE case_id = :case_id
  AND seq < (SELECT min(seq) FROM (SELECT seq FROM snapshots WHERE case_id = :case_id ORDER BY seq DESC LIMIT :keep));

-- name: inbox_put
-- Insert an input into the inbox.
INSERT INTO inbox (case_id, kind, body, request_id, created_at) VALUES (:case_id, :kind, :body, :request_id, :created_at);

-- name: inbox_done
-- An input moved into its journal leaves the inbox.
DELETE FROM inbox WHERE id = :id;

-- name: inbox_refuse
-- An input the owner refused stays, marked with why.
UPDATE inbox SET refused = :reason WHERE id = :id;

-- name: inbox_take
-- Inputs not yet refused, in order, after a given id.
SELECT id, case_id, kind, body, request_id, created_at, refused FROM inbox
WHERE refused IS NULL AND id > :after ORDER BY id LIMIT :limit;

-- name: inbox_row
-- One inbox row.
SELECT id, case_id, kind, body, request_id, created_at, refused FROM inbox WHERE id = :id;

-- name: inbox_pending
-- The inputs for a case still waiting in the inbox after an id, oldest first.
SELECT id, case_id, kind, body, request_id, created_at, refused FROM inbox
WHERE case_id = :case_id AND refused IS NULL AND id > :after ORDER BY id LIMIT :limit;

-- name: inbox_refused
-- The latest inputs the owner refused for a case, newest first.
SELECT id, case_id, kind, body, request_id, created_at, refused FROM inbox
WHERE case_id = :case_id AND refused IS NOT NULL ORDER BY id DESC LIMIT :limit;

-- name: case_row
-- One case row.
SELECT case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due, detail,
       tags, forked_from
FROM cases WHERE case_id = :case_id;

-- name: journal_start_replace
-- Replace the `start` record of a case whose journal holds nothing else (a queued case just claimed).
UPDATE journal SET record = :record
WHERE case_id = :case_id AND seq = 0 AND NOT EXISTS (SELECT 1 FROM journal WHERE case_id = :case_id AND seq > 0);

-- name: journal_after
-- The records of a case after a seq, in order.
SELECT record FROM journal WHERE case_id = :case_id AND seq > :after ORDER BY seq;

-- name: snapshot_newest
-- The newest snapshot of a case.
SELECT seq, format, bytecode, state FROM snapshots WHERE case_id = :case_id ORDER BY seq DESC LIMIT 1;

-- name: cases_live
-- The rows recovery resumes at once, oldest first (partial index cases_live).
SELECT case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due, detail,
       tags, forked_from
FROM cases WHERE live = 1 ORDER BY case_order;

-- name: cases_due
-- Parked cases whose next_due has come, earliest first (partial index cases_due), after the row
-- (:after_due, :after_order) of the page before (-Inf, 0 for the first page).
SELECT case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due, detail,
       tags, forked_from
FROM cases WHERE parked = 1 AND next_due IS NOT NULL AND next_due <= :until AND next_due >= :after_due
                 AND (next_due > :after_due OR case_order > :after_order)
ORDER BY next_due, case_order LIMIT :limit;

-- name: cases_next_due
-- The earliest next_due after :after among parked cases (one step down the partial index cases_due).
SELECT min(next_due) FROM cases WHERE parked = 1 AND next_due IS NOT NULL AND next_due > :after;

-- name: prune_select
-- The cases that ended at or before a time and whose journal holds their `end` record.
SELECT case_id FROM cases
WHERE ended_at IS NOT NULL AND ended_at <= :before
  AND EXISTS (SELECT 1 FROM journal WHERE journal.case_id = cases.case_id AND journal.kind = 'end')
LIMIT :limit;

-- name: delete_select
-- One case, if it ended, its journal holds its `end` record and no input for it waits in the inbox (`delete`).
SELECT case_id FROM cases
WHERE case_id = :case_id AND ended_at IS NOT NULL
  AND EXISTS (SELECT 1 FROM journal WHERE journal.case_id = cases.case_id AND journal.kind = 'end')
  AND NOT EXISTS (SELECT 1 FROM inbox WHERE inbox.case_id = cases.case_id AND inbox.refused IS NULL);

-- name: prune_journal
-- A pruned case's records.
DELETE FROM journal WHERE case_id = :case_id;

-- name: prune_snapshots
-- A pruned case's snapshots.
DELETE FROM snapshots WHERE case_id = :case_id;

-- name: prune_inbox
-- Inputs still in the inbox for a pruned case (refused ones: the case had ended).
DELETE FROM inbox WHERE case_id = :case_id;

-- name: prune_case
-- A pruned case's row.
DELETE FROM cases WHERE case_id = :case_id;

-- name: prune_item_started
-- A pruned case's queue item, if it started: kept as 'deleted' under a key no case id can be (:tombstone, which
-- starts with a space, then its order), so its start still counts in its queue's rate window and its id starts
-- afresh.
UPDATE queue_items SET case_id = :tombstone || item_order, state = 'deleted'
WHERE case_id = :case_id AND started_at IS NOT NULL;

-- name: prune_item
-- A pruned case's queue item that never started (cancelled while queued).
DELETE FROM queue_items WHERE case_id = :case_id;

-- name: case_queue
-- A case started by a process that does not own the file: its row, marked queued, for the owner to claim.
INSERT INTO cases (case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due,
                   live, parked, detail, queued)
VALUES (:case_id, :workflow, :fingerprint, :state, :started_at, :updated_at, :ended_at, :last_seq, :next_due,
        0, 0, :detail, 1);

-- name: cases_claim
-- The owner claims the queued cases whose version it runs: live from now on (recovery resumes them).
UPDATE cases SET queued = 0, live = 1
WHERE case_order IN (SELECT case_order FROM cases WHERE queued = 1 AND fingerprint IN (SELECT value FROM json_each(:fingerprints))
                     ORDER BY case_order LIMIT :limit)
RETURNING case_id;

-- name: program_put
-- A program version's summary, once per fingerprint (a second registration keeps the first).
INSERT INTO programs (fingerprint, workflow, summary, program_order, registered_at)
VALUES (:fingerprint, :workflow, :summary, (SELECT coalesce(max(program_order), 0) + 1 FROM programs), :now)
ON CONFLICT (fingerprint) DO NOTHING;

-- name: program_get
-- One program version's summary.
SELECT fingerprint, workflow, summary FROM programs WHERE fingerprint = :fingerprint;

-- name: program_newest
-- The newest registered version of a workflow.
SELECT fingerprint, workflow, summary FROM programs WHERE workflow = :workflow ORDER BY program_order DESC LIMIT 1;

-- name: cases_queued_any
-- Whether a queued case waits that the owner can claim (one step into the partial index cases_queued).
SELECT 1 FROM cases WHERE queued = 1 AND fingerprint IN (SELECT value FROM json_each(:fingerprints)) LIMIT 1;

-- name: inbox_waits
-- Whether an input for a case waits in the inbox (one step into the index inbox_by_case).
SELECT 1 FROM inbox WHERE case_id = :case_id AND refused IS NULL LIMIT 1;

-- name: inbox_any
-- Whether any input waits in the inbox (one step into the partial index inbox_pending).
SELECT 1 FROM inbox WHERE refused IS NULL AND id > :after LIMIT 1;

-- name: journal_first
-- The first record a case's journal keeps: its `start` (seq 0), or after a compaction its `snapshot` record.
SELECT record FROM journal WHERE case_id = :case_id ORDER BY seq LIMIT 1;

-- name: journal_request
-- The record carrying a request id (the unique index), and a compaction's `snapshot` record, which keeps the ids of
-- the records it replaced.
SELECT record FROM journal WHERE case_id = :case_id AND (request_id = :request_id OR kind = 'snapshot') ORDER BY seq;

-- name: journal_first_seq
-- The seq of the first record a case's journal keeps (NULL: no such case).
SELECT min(seq) FROM journal WHERE case_id = :case_id;

-- name: journal_compact
-- A compaction: the records before the case's new `snapshot` record go, in the transaction that appends it.
DELETE FROM journal WHERE case_id = :case_id AND seq < :seq;

-- name: snapshots_compact
-- A compaction: the snapshots taken before the case's new `snapshot` record go with the records they precede.
DELETE FROM snapshots WHERE case_id = :case_id AND seq < :seq;

-- name: case_exists
-- Whether the store holds a case with this id: a `start` record for it is refused (after a compaction its seq 0
-- is gone, its row is not).
SELECT 1 FROM cases WHERE case_id = :case_id;

-- name: cases_existing
-- Which of a group's starting cases (a JSON array of ids) the store holds already.
SELECT case_id FROM cases WHERE case_id IN (SELECT value FROM json_each(:ids));

-- name: queue_items_waiting_for
-- Which of the ids (a JSON array) a queue item waits for: queued, or claimed and its case not written yet. A write
-- that starts a case of one of them, other than its item's own, is refused (see CaseWrite.from_queue).
SELECT q.case_id FROM queue_items q
WHERE q.case_id IN (SELECT value FROM json_each(:ids)) AND q.state IN ('queued', 'started')
  AND NOT EXISTS (SELECT 1 FROM cases c WHERE c.case_id = q.case_id);

-- name: schedule_register
-- A schedule's registration: the newest wins; a new one starts at :first_slot. Returns the row as it is now.
INSERT INTO schedules (name, spec, last_slot, last_case, paused, updated_at)
VALUES (:name, :spec, :first_slot, NULL, 0, :now)
ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at
RETURNING name, spec, last_slot, last_case, paused, updated_at;

-- name: schedule_get
-- One schedule.
SELECT name, spec, last_slot, last_case, paused, updated_at FROM schedules WHERE name = :name;

-- name: schedule_advance
-- Move a schedule on to a newer slot (a slot is dealt with once: whoever moves it first).
UPDATE schedules SET last_slot = :slot, last_case = coalesce(:case_id, last_case), updated_at = :now
WHERE name = :name AND (last_slot IS NULL OR last_slot < :slot);

-- name: schedule_pause
-- Pause or resume a schedule.
UPDATE schedules SET paused = :paused, updated_at = :now WHERE name = :name;

-- name: schedules_all
-- Every schedule, by name.
SELECT name, spec, last_slot, last_case, paused, updated_at FROM schedules ORDER BY name;

-- name: queue_sweep
-- Mark the started items of a queue whose case has ended (the started ones stay few).
UPDATE queue_items SET state = 'ended'
WHERE state = 'started' AND queue = :queue
  AND EXISTS (SELECT 1 FROM cases c WHERE c.case_id = queue_items.case_id AND c.ended_at IS NOT NULL);

-- name: queue_id_taken
-- Whether a case or a queue item has this id.
SELECT 1 FROM queue_items WHERE case_id = :case_id UNION ALL SELECT 1 FROM cases WHERE case_id = :case_id LIMIT 1;

-- name: queue_dedup_holder
-- A live item of a queue holding a dedup key.
SELECT case_id FROM queue_items WHERE queue = :queue AND dedup = :dedup AND state IN ('queued', 'started') LIMIT 1;

-- name: queue_put
-- A queued case (due at once unless it has a delay).
INSERT INTO queue_items (case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, item_order, due)
VALUES (:case_id, :queue, :part, :priority, :dedup, :start, :not_before, :enqueued_at, 'queued',
        (SELECT coalesce(max(item_order), 0) + 1 FROM queue_items), :not_before <= :enqueued_at);

-- name: queue_promote
-- A queue's items whose delay has passed are due (a claim reads due items only: see migration 11).
UPDATE queue_items SET due = 1 WHERE queue = :queue AND state = 'queued' AND due = 0 AND not_before <= :now;

-- name: queue_next_due
-- When the next delayed item of a queue is due.
SELECT min(not_before) FROM queue_items WHERE queue = :queue AND state = 'queued' AND due = 0;

-- name: queue_ready
-- A queue's first due items in the order they start.
SELECT case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order
FROM queue_items WHERE queue = :queue AND state = 'queued' AND due = 1 ORDER BY priority, item_order LIMIT :limit;

-- name: queue_ready_parts
-- The partitions of a queue that hold due items ('' for the items without a key), each found by one step into
-- queue_items_ready_parts however many items it holds.
WITH RECURSIVE parts(part) AS (
    SELECT (SELECT min(coalesce(part, '')) FROM queue_items WHERE queue = :queue AND state = 'queued' AND due = 1)
    UNION ALL
    SELECT (SELECT min(coalesce(q.part, '')) FROM queue_items q
            WHERE q.queue = :queue AND q.state = 'queued' AND q.due = 1 AND coalesce(q.part, '') > parts.part)
    FROM parts WHERE parts.part IS NOT NULL
)
SELECT part FROM parts WHERE part IS NOT NULL;

-- name: queue_ready_in_part
-- The first due items of one partition of a queue ('': the items without a key), in start order.
SELECT case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order
FROM queue_items WHERE queue = :queue AND state = 'queued' AND due = 1 AND coalesce(part, '') = :part
ORDER BY priority, item_order LIMIT :limit;

-- name: queue_running
-- A queue's started items whose case has not ended.
SELECT part, node FROM queue_items WHERE queue = :queue AND state = 'started';

-- name: queue_recent
-- A queue's starts since a time (its rate window).
SELECT part, started_at FROM queue_items WHERE queue = :queue AND started_at > :since;

-- name: queue_start
-- Claim one waiting item for a node.
UPDATE queue_items SET state = 'started', started_at = :now, node = :node WHERE case_id = :case_id AND state = 'queued';

-- name: queue_dedup_other
-- A live item of a queue holding a dedup key, other than :case_id's own.
SELECT case_id FROM queue_items
WHERE queue = :queue AND dedup = :dedup AND state IN ('queued', 'started') AND case_id <> :case_id LIMIT 1;

-- name: queue_keep_start
-- The start of a retried case's item, kept under :key (no case id can be it) as a deleted case's is, so it still
-- counts in its queue's rate window.
INSERT INTO queue_items (case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at,
                         node, item_order, due)
SELECT :key, queue, part, priority, NULL, start, not_before, enqueued_at, 'deleted', started_at, node,
       (SELECT coalesce(max(item_order), 0) + 1 FROM queue_items), 0
FROM queue_items WHERE case_id = :case_id AND started_at IS NOT NULL;

-- name: queue_requeue
-- A retried case's item queued again (due at once), keeping its place; :start marks it retried.
UPDATE queue_items SET state = 'queued', started_at = NULL, node = NULL, due = 1, start = :start
WHERE case_id = :case_id AND state IN ('started', 'ended');

-- name: cases_dequeued
-- The row of a retried case whose queue item was just claimed: live again (:state, running), so that the claimer,
-- or the next owner's recovery, runs it from its retry record.
UPDATE cases SET state = :state, live = 1, parked = 0 WHERE case_id = :case_id AND state = 'queued';

-- name: queue_cancel
-- Cancel a waiting item.
UPDATE queue_items SET state = 'cancelled' WHERE case_id = :case_id AND state = 'queued';

-- name: queue_get
-- One item.
SELECT case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order
FROM queue_items WHERE case_id = :case_id;

-- name: queue_list
-- Items newest first, by state and queue.
SELECT case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order
FROM queue_items WHERE (:state IS NULL OR state = :state) AND (:queue IS NULL OR queue = :queue)
  AND (:before IS NULL OR item_order < :before)
ORDER BY item_order DESC LIMIT :limit;

-- name: queue_orphans_take
-- Items claimed by a process that stopped before writing their case (the file's owner is the only claimer, so
-- every such item is an earlier owner's), taken by node :node.
UPDATE queue_items SET node = :node
WHERE state = 'started' AND NOT EXISTS (SELECT 1 FROM cases c WHERE c.case_id = queue_items.case_id);

-- name: queue_orphans
-- Items node :node claimed whose case it has not written.
SELECT case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order
FROM queue_items q WHERE state = 'started' AND node = :node
  AND NOT EXISTS (SELECT 1 FROM cases c WHERE c.case_id = q.case_id);

-- name: queue_spec_get
-- A queue's registered configuration.
SELECT spec, node FROM queues WHERE name = :name;

-- name: queue_register
-- A queue's configuration: the newest registration wins.
INSERT INTO queues (name, spec, node, updated_at) VALUES (:name, :spec, :node, :now)
ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, node = excluded.node, updated_at = excluded.updated_at;

-- name: queue_specs
-- Every queue's configuration.
SELECT name, spec FROM queues ORDER BY name;

-- name: heartbeats_put
-- The last heartbeats of a case's in-flight effects (JSON), beside its row; a case without a row is left alone.
UPDATE cases SET heartbeats = :heartbeats WHERE case_id = :case_id;

-- name: heartbeats_get
-- What `heartbeats_put` kept for a case.
SELECT heartbeats FROM cases WHERE case_id = :case_id;

-- name: children_of_ended
-- Child cases that have not ended whose parent has (its cancel may not have reached them: see _runtime/_children).
SELECT c.case_id, c.parent FROM cases c JOIN cases p ON p.case_id = c.parent
WHERE c.parent IS NOT NULL AND c.ended_at IS NULL AND p.ended_at IS NOT NULL
ORDER BY c.case_order LIMIT :limit;

-- name: children_waited_for
-- Child cases that have not ended, whose parent has not ended either and waits for them with "cancel" (their row
-- names the parent's step): a parent that withdrew that step may have died before cancelling them (see
-- _runtime/_children). The step is JSON text. (:owner, a node's id on a shared store, is not asked: the file's owner
-- owns every case.)
SELECT c.case_order, c.case_id, c.parent, json_extract(c.detail, '$.parent_step') AS step
FROM cases c JOIN cases p ON p.case_id = c.parent
WHERE c.parent IS NOT NULL AND c.ended_at IS NULL AND p.ended_at IS NULL AND c.case_order > :after
  AND json_extract(c.detail, '$.parent_step') IS NOT NULL
ORDER BY c.case_order LIMIT :limit;

-- Every statement the Postgres store runs, by name (`-- name: NAME`, then what it does). Values are always bound
-- parameters: named (`:case_id`) in the queries that `_sql_store.py` runs on every database, under the same
-- names as SQLite's (`_sql.py` numbers them `$1`, `$2`, ... once, at load, for asyncpg); numbered (`$1`, `$2`,
-- ...) in those only `_postgres.py` runs, which pass their values by position. Names are unqualified: each
-- connection's `search_path` is the store's schema. The only text the store formats itself is the schema name in
-- CREATE SCHEMA (a checked identifier, quoted).
-- The functions called here (write_case, inbox_put, inbox_lock_key, take_over, claim_queued, db_now) are in
-- migrations/.

-- name: lock_layout
-- One opener at a time checks, builds or migrates a schema (released at the end of its transaction).
SELECT pg_advisory_xact_lock(hashtext($1));

-- name: schema_exists
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1);

-- name: count_tables
-- Whether the schema holds anything yet (a new schema holds nothing).
SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1;

-- name: meta_table_exists
SELECT EXISTS (
    SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $1 AND c.relname = 'meta' AND c.relkind = 'r'
);

-- name: meta_get
SELECT value FROM meta WHERE key = $1;

-- name: meta_put
INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: db_now
-- Database time, seconds since the epoch.
SELECT db_now();

-- name: node_register
-- Take or renew this node's lease, unless another live process holds the same node id; returns database time.
-- A holder is live while its lease holds and it has a connection open: each connection of a node process is
-- named (application_name) 'wfsub ' and the first 16 hex digits of md5('NODE PID HOST'), so a holder killed
-- without closing (kill -9, a crash) gives its node id up as soon as the server has seen its connections close.
INSERT INTO nodes (node_id, pid, host, since, lease_until) VALUES ($1, $2, $3, db_now(), db_now() + $4)
ON CONFLICT (node_id) DO UPDATE SET
    pid = excluded.pid, host = excluded.host, since = excluded.since, lease_until = excluded.lease_until
WHERE nodes.lease_until <= db_now() OR (nodes.pid = excluded.pid AND nodes.host = excluded.host)
    OR NOT EXISTS (
        SELECT 1 FROM pg_stat_activity a
        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
          AND a.application_name = 'wfsub ' || left(md5(nodes.node_id || ' ' || nodes.pid || ' ' || nodes.host), 16)
    )
RETURNING lease_until - $4;

-- name: node_fence_earlier
-- A process that opens as a node bumps the epoch of every live case the node owns: an earlier process with the
-- same node id (paused past its lease, not dead) still holds the old epochs, so each of its appends is refused.
UPDATE cases SET epoch = epoch + 1 WHERE owner = $1 AND ended_at IS NULL;

-- name: node_get
-- One node's lease: who holds it and for how long still (negative: expired).
SELECT node_id, pid, host, since, lease_until - db_now() FROM nodes WHERE node_id = $1;

-- name: node_renew
-- Extend this node's lease to database now + lease seconds; returns database time (no row: not ours any more).
UPDATE nodes SET lease_until = db_now() + $4 WHERE node_id = $1 AND pid = $2 AND host = $3
RETURNING lease_until - $4;

-- name: node_release
-- A node that closes gives its lease up at once, so another node may take its cases over without waiting.
UPDATE nodes SET lease_until = db_now() WHERE node_id = $1 AND pid = $2 AND host = $3;

-- name: node_live
-- The nodes whose lease holds, this one first, then the most recent.
SELECT node_id, pid, host, since FROM nodes WHERE lease_until > db_now()
ORDER BY (node_id = :node) DESC, since DESC;

-- name: write_group
-- One write of a case (see write_case); the group commit runs it once per write, all in one transaction. The
-- last parameter is the group's commit token on its first write, NULL on the others. A write of records or a row
-- that does not carry the first record of a journal ($6[1]: `start`, or a compacted fork's `snapshot`) needs the
-- case: its row is locked first, and a case deleted meanwhile (a row the lock waited for and found gone) is
-- answered 'gone' with nothing written (write_case would insert it again: a row or a journal with no start).
-- write_case is not run then (a one-time filter), so the group's commit token is recorded here instead.
WITH held AS (
    SELECT 1 FROM cases WHERE case_id = $2 FOR UPDATE
), gone AS (
    SELECT (coalesce(cardinality($5::bigint[]), 0) > 0 OR $9::boolean)
           AND coalesce(($6::text[])[1], '') NOT IN ('start', 'snapshot')
           AND NOT EXISTS (SELECT 1 FROM held) AS gone
), token AS (
    INSERT INTO commits (token, at) SELECT $29::text, db_now()
    WHERE $29::text IS NOT NULL AND (SELECT gone FROM gone)
    RETURNING 1
)
SELECT status, appended, info, at_seq, cur_owner, cur_epoch
FROM write_case($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,
                $22, $23, $24, $25, $26, $27, $28, $29)
WHERE NOT (SELECT gone FROM gone)
UNION ALL
SELECT 'gone', NULL::boolean[], NULL::text, NULL::bigint, NULL::text, NULL::bigint WHERE (SELECT gone FROM gone);

-- name: inbox_put
-- Insert an input into the inbox (and NOTIFY its case's owner); returns its id. The last parameter: as above.
SELECT inbox_put($1, $2, $3, $4, $5, $6, $7);

-- name: journal_at
-- A case's records at the given seqs (seq, record): read back, after its group committed with its answer lost,
-- to learn what one write of that group did.
SELECT seq, record FROM journal WHERE case_id = $1 AND seq = ANY ($2::bigint[]);

-- name: commit_known
-- Whether the group that carried this token committed (asked after its connection was lost).
SELECT EXISTS (SELECT 1 FROM commits WHERE token = $1);

-- name: commits_trim
-- Forget the tokens of groups committed more than $1 seconds ago.
DELETE FROM commits WHERE at < db_now() - $1;

-- name: backend_me
-- This connection's server process: its pid and start time (a pid alone may be reused after a restart).
SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid();

-- name: backend_end
-- End the server process that ran a group whose answer was lost (a transaction it still runs is aborted);
-- only that process: same pid and same start time.
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2;

-- name: backend_alive
SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start = $2);

-- name: take_over
-- Take over cases of nodes whose lease expired (see take_over in migrations/).
SELECT case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due,
       detail, owner, epoch, tags::text, forked_from
FROM take_over($1, $2);

-- name: take_ended
-- Take an ended case (to retry it) that no node owns, or whose owner's lease has expired; this node's lease must
-- be live. Its epoch is bumped, as a takeover's.
UPDATE cases c SET owner = $2, epoch = c.epoch + 1
WHERE c.case_id = $1 AND c.ended_at IS NOT NULL
  AND EXISTS (SELECT 1 FROM nodes n WHERE n.node_id = $2 AND n.lease_until > db_now())
  AND (c.owner IS NULL OR c.owner = $2
       OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.node_id = c.owner AND n.lease_until > db_now()))
RETURNING c.case_order, c.case_id, c.workflow, c.fingerprint, c.state, c.started_at, c.updated_at, c.ended_at,
          c.last_seq, c.next_due, c.detail, c.owner, c.epoch, c.tags::text, c.forked_from;

-- name: claim_queued
-- Claim queued cases whose fingerprint this node has registered.
SELECT claim_queued FROM claim_queued($1, $2, $3);

-- name: inbox_take_owned
-- Inputs not yet refused, in id order, after an id, for cases this node owns or for no case at all, and the
-- `retry` of an ended case whose owner's lease has expired (a node gone for good: any node takes the case to
-- re-open it, `take_ended`; one that finds another node took it first leaves the input to that node).
SELECT i.id, i.case_id, i.kind, i.body, i.request_id, i.created_at, i.refused
FROM inbox i LEFT JOIN cases c ON c.case_id = i.case_id
WHERE i.refused IS NULL AND i.id > :after
  AND (c.owner = :node OR c.case_id IS NULL
       OR (i.kind = 'retry' AND c.ended_at IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.node_id = c.owner AND n.lease_until > db_now())))
ORDER BY i.id LIMIT :limit;

-- name: inbox_take_all
-- Inputs not yet refused, in id order, after an id (a store opened without a lease sees them all).
SELECT id, case_id, kind, body, request_id, created_at, refused FROM inbox
WHERE refused IS NULL AND id > :after ORDER BY id LIMIT :limit;

-- name: inbox_row
SELECT id, case_id, kind, body, request_id, created_at, refused FROM inbox WHERE id = :id;

-- name: inbox_pending
-- The inputs for a case still waiting in the inbox after an id, oldest first (index inbox_by_case).
SELECT id, case_id, kind, body, request_id, created_at, refused FROM inbox
WHERE case_id = :case_id AND refused IS NULL AND id > :after ORDER BY id LIMIT :limit;

-- name: inbox_refused
-- The latest inputs the owner refused for a case, newest first.
SELECT id, case_id, kind, body, request_id, created_at, refused FROM inbox
WHERE case_id = :case_id AND refused IS NOT NULL ORDER BY id DESC LIMIT :limit;

-- name: case_row
SELECT case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due,
       detail, owner, epoch, tags::text, forked_from
FROM cases WHERE case_id = :case_id;

-- name: journal_start_replace
-- Replace the `start` record of a case whose journal holds nothing else (a queued case just claimed).
UPDATE journal SET record = :record
WHERE case_id = :case_id AND seq = 0 AND NOT EXISTS (SELECT 1 FROM journal WHERE case_id = :case_id AND seq > 0);

-- name: journal_after
SELECT record FROM journal WHERE case_id = :case_id AND seq > :after ORDER BY seq;

-- name: journal_epochs
-- Each record's seq and the epoch it was appended at (tests check fencing with it).
SELECT seq, epoch FROM journal WHERE case_id = :case_id ORDER BY seq;

-- name: snapshot_newest
SELECT seq, format, bytecode, state FROM snapshots WHERE case_id = :case_id ORDER BY seq DESC LIMIT 1;

-- name: cases_live_owned
-- The rows recovery resumes at once: this node's, oldest first (partial index cases_live).
SELECT case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due,
       detail, owner, epoch, tags::text, forked_from
FROM cases WHERE live AND owner = :node ORDER BY case_order;

-- name: cases_live_all
SELECT case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due,
       detail, owner, epoch, tags::text, forked_from
FROM cases WHERE live ORDER BY case_order;

-- name: cases_due_owned
-- This node's parked cases whose next_due has come, earliest first (partial index cases_due), after the row
-- (:after_due, :after_order) = (next_due, case_order) of the page before ('-Infinity', 0 for the first page).
SELECT case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due,
       detail, owner, epoch, tags::text, forked_from
FROM cases WHERE parked AND next_due IS NOT NULL AND next_due <= :until AND owner = :node
                 AND (next_due, case_order) > (:after_due, :after_order)
ORDER BY next_due, case_order LIMIT :limit;

-- name: cases_due_all
SELECT case_order, case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq, next_due,
       detail, owner, epoch, tags::text, forked_from
FROM cases WHERE parked AND next_due IS NOT NULL AND next_due <= :until
                 AND (next_due, case_order) > (:after_due, :after_order)
ORDER BY next_due, case_order LIMIT :limit;

-- name: cases_next_due_owned
-- The earliest next_due after :after among this node's parked cases.
SELECT min(next_due) FROM cases WHERE parked AND next_due IS NOT NULL AND owner = :node AND next_due > :after;

-- name: cases_next_due_all
SELECT min(next_due) FROM cases WHERE parked AND next_due IS NOT NULL AND next_due > :after;

-- name: prune
-- Remove cases that ended before a time and whose journal holds their `end`, at most $2 (NULL: all), in one
-- statement; returns how many. A removed case's queue item goes too; one that started is kept as 'deleted' under
-- a key no case id can be ($3, which starts with a space, then its order), so its start still counts in its
-- queue's rate window (see _store/_queueing.py).
WITH gone AS (
    SELECT c.case_id FROM cases c
    WHERE c.ended_at IS NOT NULL AND c.ended_at <= $1
      AND EXISTS (SELECT 1 FROM journal j WHERE j.case_id = c.case_id AND j.kind = 'end')
    ORDER BY c.case_order LIMIT $2
    FOR UPDATE OF c SKIP LOCKED
), journal_gone AS (
    DELETE FROM journal WHERE case_id IN (SELECT case_id FROM gone)
), snapshots_gone AS (
    DELETE FROM snapshots WHERE case_id IN (SELECT case_id FROM gone)
), inbox_gone AS (
    DELETE FROM inbox WHERE case_id IN (SELECT case_id FROM gone)
), items_kept AS (
    UPDATE queue_items SET case_id = $3::text || item_order, state = 'deleted'
    WHERE case_id IN (SELECT case_id FROM gone) AND started_at IS NOT NULL
), items_gone AS (
    DELETE FROM queue_items WHERE case_id IN (SELECT case_id FROM gone) AND started_at IS NULL
), cases_gone AS (
    DELETE FROM cases WHERE case_id IN (SELECT case_id FROM gone) RETURNING 1
)
SELECT count(*) FROM cases_gone;

-- name: delete_lock_case
-- A delete's first statement: lock the case row (NULL: no such case), waiting for a write that holds it.
SELECT 1 FROM cases WHERE case_id = $1 FOR UPDATE;

-- name: delete_hold_inbox
-- A delete's second statement, the row held: take the case's inbox key exclusively if no input put holds it
-- (false: one is in flight; see migration 10).
SELECT pg_try_advisory_xact_lock(inbox_lock_key($1));

-- name: delete_wait_inbox
-- Wait, holding nothing else, until the input puts of a case in flight have ended (the lock goes with the
-- statement's own transaction).
SELECT pg_advisory_xact_lock(inbox_lock_key($1));

-- name: delete
-- A delete's last statement, the row and the inbox key held (so its snapshot sees every input put for the case):
-- remove the case if it ended, its journal holds its `end` and no input for it waits in the inbox; returns how
-- many (0 or 1). The other nodes are told (NOTIFY 'd', $2: this store's sender id), so none answers for the
-- case from memory. Its queue item as `prune` says ($3: the key's prefix).
WITH gone AS (
    SELECT c.case_id FROM cases c
    WHERE c.case_id = $1 AND c.ended_at IS NOT NULL
      AND EXISTS (SELECT 1 FROM journal j WHERE j.case_id = c.case_id AND j.kind = 'end')
      AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.case_id = c.case_id AND i.refused IS NULL)
    FOR UPDATE OF c
), journal_gone AS (
    DELETE FROM journal WHERE case_id IN (SELECT case_id FROM gone)
), snapshots_gone AS (
    DELETE FROM snapshots WHERE case_id IN (SELECT case_id FROM gone)
), inbox_gone AS (
    DELETE FROM inbox WHERE case_id IN (SELECT case_id FROM gone)
), items_kept AS (
    UPDATE queue_items SET case_id = $3::text || item_order, state = 'deleted'
    WHERE case_id IN (SELECT case_id FROM gone) AND started_at IS NOT NULL
), items_gone AS (
    DELETE FROM queue_items WHERE case_id IN (SELECT case_id FROM gone) AND started_at IS NULL
), cases_gone AS (
    DELETE FROM cases WHERE case_id IN (SELECT case_id FROM gone) RETURNING case_id
), told AS (
    SELECT notify_change(json_build_object(
        'k', 'd', 's', $2::text, 'c', CASE WHEN length(case_id) <= 1000 THEN case_id END
    )) FROM cases_gone
)
SELECT count(*) FROM told;

-- name: program_put
-- A program version's summary, once per fingerprint (a second registration keeps the first).
INSERT INTO programs (fingerprint, workflow, summary, registered_at)
VALUES (:fingerprint, :workflow, :summary, db_now())
ON CONFLICT (fingerprint) DO NOTHING;

-- name: program_get
-- One program version's summary.
SELECT fingerprint, workflow, summary FROM programs WHERE fingerprint = :fingerprint;

-- name: program_newest
-- The newest registered version of a workflow.
SELECT fingerprint, workflow, summary FROM programs WHERE workflow = :workflow ORDER BY program_order DESC LIMIT 1;

-- name: compact_group
-- One compacting write of a case: `write_group`'s write (which appends its `snapshot` record at seq $29, fenced
-- as any write), then, only if it was applied, the case's records and snapshots before that seq are deleted, in
-- the same statement and so the same transaction. $30 is the group's commit token, as `write_group`'s last.
WITH written AS (
    SELECT status, appended, info, at_seq, cur_owner, cur_epoch
    FROM write_case($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,
                    $22, $23, $24, $25, $26, $27, $28, $30)
), gone AS (
    DELETE FROM journal WHERE case_id = $2 AND seq < $29::bigint AND (SELECT status FROM written) = 'ok'
    RETURNING 1
), gone_snapshots AS (
    DELETE FROM snapshots WHERE case_id = $2 AND seq < $29::bigint AND (SELECT status FROM written) = 'ok'
    RETURNING 1
)
SELECT status, appended, info, at_seq, cur_owner, cur_epoch FROM written;

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

-- name: start_group
-- `write_group` for a write carrying a `start` record: refused as a seq 0 written twice when the case exists (a
-- compaction removes its seq 0, never its row); write_case is not run then (a one-time filter), so the group's
-- commit token (on its first write) is recorded here instead. $29: whether the write is its queue item's own start
-- (CaseWrite.from_queue: not refused for that item waiting); $30: the commit token.
WITH token AS (
    INSERT INTO commits (token, at) SELECT $30::text, db_now()
    WHERE $30::text IS NOT NULL AND EXISTS (SELECT 1 FROM cases WHERE case_id = $2)
    RETURNING 1
)
SELECT status, appended, info, at_seq, cur_owner, cur_epoch
FROM write_case($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,
                $22, $23, $24, $25, $26, $27, $28, $30, $29::boolean)
WHERE NOT EXISTS (SELECT 1 FROM cases WHERE case_id = $2)
UNION ALL
SELECT 'conflict', NULL::boolean[], 'journal_pkey', 0::bigint, NULL::text, NULL::bigint
WHERE EXISTS (SELECT 1 FROM cases WHERE case_id = $2);

-- name: start_scheduled
-- `start_group` for the start of a schedule's slot ($30: the schedule's name; $31: the commit token): refused
-- ('schedule_paused') while that schedule is paused. Its row is read under a share lock held until the group
-- commits, so a pause (an update of the row) waits for a start that read it first, and a start that reads it
-- after the pause committed sees it paused: no slot starts after pause_schedule returned.
WITH paused AS MATERIALIZED (
    SELECT coalesce((SELECT s.paused FROM schedules s WHERE s.name = $30 FOR SHARE), false) AS paused
), token AS (
    INSERT INTO commits (token, at) SELECT $31::text, db_now() FROM paused
    WHERE $31::text IS NOT NULL AND (paused.paused OR EXISTS (SELECT 1 FROM cases WHERE case_id = $2))
    RETURNING 1
)
SELECT status, appended, info, at_seq, cur_owner, cur_epoch
FROM write_case($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21,
                $22, $23, $24, $25, $26, $27, $28, $31, $29::boolean)
WHERE NOT EXISTS (SELECT 1 FROM cases WHERE case_id = $2) AND NOT (SELECT paused FROM paused)
UNION ALL
SELECT 'conflict', NULL::boolean[], 'journal_pkey', 0::bigint, NULL::text, NULL::bigint
WHERE EXISTS (SELECT 1 FROM cases WHERE case_id = $2)
UNION ALL
SELECT 'conflict', NULL::boolean[], 'schedule_paused', 0::bigint, NULL::text, NULL::bigint
WHERE NOT EXISTS (SELECT 1 FROM cases WHERE case_id = $2) AND (SELECT paused FROM paused);

-- name: schedule_paused
-- Whether a schedule is paused, its row held (shared) until the transaction ends: see start_scheduled.
SELECT paused FROM schedules WHERE name = $1 FOR SHARE;

-- name: schedule_register
-- A schedule's registration: the newest wins; a new one starts at :first_slot. Returns the row as it is now.
INSERT INTO schedules (name, spec, last_slot, last_case, paused, updated_at)
VALUES (:name, :spec, :first_slot, NULL, false, db_now())
ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, updated_at = excluded.updated_at
RETURNING name, spec, last_slot, last_case, paused, updated_at;

-- name: schedule_advance
-- Move a schedule on to a newer slot (a slot is dealt with once: whoever moves it first).
UPDATE schedules SET last_slot = :slot, last_case = coalesce(:case_id, last_case), updated_at = db_now()
WHERE name = :name AND (last_slot IS NULL OR last_slot < :slot);

-- name: schedule_pause
-- Pause or resume a schedule.
UPDATE schedules SET paused = :paused, updated_at = db_now() WHERE name = :name;

-- name: schedules_all
-- Every schedule, by name.
SELECT name, spec, last_slot, last_case, paused, updated_at FROM schedules ORDER BY name;

-- name: queue_lock
-- One claim or dedup check at a time per queue, across nodes (released at the end of the transaction).
SELECT pg_advisory_xact_lock(hashtext('wfsub queue ' || $1));

-- name: queue_sweep
-- Mark the started items of a queue whose case has ended (the started ones stay few).
UPDATE queue_items q SET state = 'ended'
WHERE q.state = 'started' AND q.queue = $1
  AND EXISTS (SELECT 1 FROM cases c WHERE c.case_id = q.case_id AND c.ended_at IS NOT NULL);

-- name: case_id_lock
-- One start or queueing of a case id at a time, across nodes (write_case takes it too, before it looks for a
-- waiting queue item of the id; released at the end of the transaction). The key is this schema's: another
-- schema's starts of the same id never wait for it.
SELECT pg_advisory_xact_lock(hashtextextended('wfsub case id ' || current_schema() || ' ' || $1, 0));

-- name: queue_id_taken
-- Whether a case or a queue item has this id.
SELECT 1 FROM queue_items WHERE case_id = $1 UNION ALL SELECT 1 FROM cases WHERE case_id = $1 LIMIT 1;

-- name: queue_dedup_holder
-- A live item of a queue holding a dedup key.
SELECT case_id FROM queue_items WHERE queue = $1 AND dedup = $2 AND state IN ('queued', 'started') LIMIT 1;

-- name: queue_put
-- A queued case (due at once unless it has a delay).
INSERT INTO queue_items (case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, due)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'queued', $7::double precision <= $8::double precision);

-- name: queue_promote
-- A queue's items whose delay has passed are due (a claim reads due items only: see migration 11).
UPDATE queue_items SET due = true WHERE queue = $1 AND state = 'queued' AND NOT due AND not_before <= $2;

-- name: queue_next_due
-- When the next delayed item of a queue is due.
SELECT min(not_before) FROM queue_items WHERE queue = $1 AND state = 'queued' AND NOT due;

-- name: queue_ready
-- A queue's first due items in the order they start.
SELECT case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order
FROM queue_items WHERE queue = $1 AND state = 'queued' AND due ORDER BY priority, item_order LIMIT $2;

-- name: queue_ready_parts
-- The partitions of a queue that hold due items ('' for the items without a key), each found by one step into
-- queue_items_ready_parts however many items it holds.
WITH RECURSIVE parts(part) AS (
    SELECT (SELECT min(coalesce(part, '')) FROM queue_items WHERE queue = $1 AND state = 'queued' AND due)
    UNION ALL
    SELECT (SELECT min(coalesce(q.part, '')) FROM queue_items q
            WHERE q.queue = $1 AND q.state = 'queued' AND q.due AND coalesce(q.part, '') > parts.part)
    FROM parts WHERE parts.part IS NOT NULL
)
SELECT part FROM parts WHERE part IS NOT NULL;

-- name: queue_ready_in
-- The first $3 due items of each partition named in $2 ('': the items without a key), the first $4 of them in
-- start order.
SELECT i.case_id, i.queue, i.part, i.priority, i.dedup, i.start, i.not_before, i.enqueued_at, i.state, i.started_at,
       i.node, i.item_order
FROM unnest($2::text[]) AS p(part) CROSS JOIN LATERAL (
    SELECT * FROM queue_items q
    WHERE q.queue = $1 AND q.state = 'queued' AND q.due AND coalesce(q.part, '') = p.part
    ORDER BY q.priority, q.item_order LIMIT $3
) i
ORDER BY i.priority, i.item_order LIMIT $4;

-- name: queue_running
-- A queue's started items whose case has not ended.
SELECT part, node FROM queue_items WHERE queue = $1 AND state = 'started';

-- name: queue_recent
-- A queue's starts since a time (its rate window).
SELECT part, started_at FROM queue_items WHERE queue = $1 AND started_at > $2;

-- name: queue_start
-- Claim one waiting item for a node.
UPDATE queue_items SET state = 'started', started_at = $2, node = $3 WHERE case_id = $1 AND state = 'queued';

-- name: queue_of
-- The queue of an item.
SELECT queue FROM queue_items WHERE case_id = $1;

-- name: queue_dedup_other
-- A live item of a queue holding a dedup key, other than $3's own.
SELECT case_id FROM queue_items
WHERE queue = $1 AND dedup = $2 AND state IN ('queued', 'started') AND case_id <> $3 LIMIT 1;

-- name: queue_keep_start
-- The start of a retried case's item ($1), kept under $2 (no case id can be it) as a deleted case's is, so it still
-- counts in its queue's rate window.
INSERT INTO queue_items (case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at,
                         node, due)
SELECT $2, queue, part, priority, NULL, start, not_before, enqueued_at, 'deleted', started_at, node, false
FROM queue_items WHERE case_id = $1 AND started_at IS NOT NULL;

-- name: queue_requeue
-- A retried case's item queued again (due at once), keeping its place; $2 marks it retried.
UPDATE queue_items SET state = 'queued', started_at = NULL, node = NULL, due = true, start = $2
WHERE case_id = $1 AND state IN ('started', 'ended')
RETURNING case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order;

-- name: cases_dequeued
-- The rows of retried cases whose queue items node $2 just claimed: live again ($3, running) and its own, their
-- epochs bumped, so that it (or whoever takes its cases over) runs them from their retry records.
UPDATE cases SET state = $3, live = true, parked = false, owner = $2, epoch = epoch + 1
WHERE case_id = ANY ($1::text[]) AND state = 'queued';

-- name: queue_cancel
-- Cancel a waiting item (its case's ended write follows in the same transaction: `write_group`).
UPDATE queue_items SET state = 'cancelled' WHERE case_id = $1 AND state = 'queued'
RETURNING case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order;

-- name: case_ended
-- Whether the case has ended (a cancel in its queue read back after a lost commit answer).
SELECT 1 FROM cases WHERE case_id = $1 AND ended_at IS NOT NULL;

-- name: queue_get
-- One item.
SELECT case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order
FROM queue_items WHERE case_id = :case_id;

-- name: queue_list
-- Items newest first, by state and queue.
SELECT case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order
FROM queue_items WHERE (:state::text IS NULL OR state = :state) AND (:queue::text IS NULL OR queue = :queue)
  AND (:before::bigint IS NULL OR item_order < :before)
ORDER BY item_order DESC LIMIT :limit;

-- name: queue_orphans
-- Items claimed by a node that stopped before writing their case, taken over by node $1: those of nodes whose
-- lease has run out, and with $2 its own (claimed by an earlier process with its node id). The update re-checks a
-- row another node took meanwhile (its new claimer's lease holds), so each is taken by one node.
UPDATE queue_items q SET node = $1
WHERE q.state = 'started' AND NOT EXISTS (SELECT 1 FROM cases c WHERE c.case_id = q.case_id)
  AND ((q.node = $1 AND $2)
       OR (q.node IS DISTINCT FROM $1
           AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.node_id = q.node AND n.lease_until > db_now())))
RETURNING case_id, queue, part, priority, dedup, start, not_before, enqueued_at, state, started_at, node, item_order;

-- name: queue_spec_get
-- A queue's registered configuration.
SELECT spec, node FROM queues WHERE name = $1;

-- name: queue_register
-- A queue's configuration: the newest registration wins.
INSERT INTO queues (name, spec, node, updated_at) VALUES ($1, $2, $3, db_now())
ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, node = excluded.node, updated_at = excluded.updated_at;

-- name: queue_specs
-- Every queue's configuration.
SELECT name, spec FROM queues ORDER BY name;

-- name: heartbeats_put
-- The last heartbeats of a case's in-flight effects (JSON), beside its row: only while this node owns the case at
-- the epoch given (:epoch NULL: the owner alone is checked).
UPDATE cases SET heartbeats = :heartbeats
WHERE case_id = :case_id AND owner = :node AND (:epoch::bigint IS NULL OR epoch = :epoch);

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
-- _runtime/_children). Only those whose parent node :owner owns (:owner NULL: every one). The step is JSON text.
SELECT c.case_order, c.case_id, c.parent, (c.detail::jsonb) ->> 'parent_step' AS step
FROM cases c JOIN cases p ON p.case_id = c.parent
WHERE c.parent IS NOT NULL AND c.ended_at IS NULL AND p.ended_at IS NULL AND c.case_order > :after
  AND (:owner::text IS NULL OR p.owner = :owner) AND (c.detail::jsonb) ? 'parent_step'
ORDER BY c.case_order LIMIT :limit;

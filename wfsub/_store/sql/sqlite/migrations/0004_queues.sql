-- Migration 4: queued cases.
--
-- A case started with new_case(..., queue=) waits here until its queue has room; the owner claims it (state
-- 'started', started_at = the dequeue time) and starts it as any case. 'ended' marks a started item whose case has
-- ended (so the started ones stay few); 'cancelled' one cancelled while it waited. See wfsub/_store/_queueing.py.
CREATE TABLE queue_items (
    case_id     TEXT PRIMARY KEY,
    queue       TEXT NOT NULL,
    part        TEXT,  -- the partition key (NULL: none)
    priority    INTEGER NOT NULL,
    dedup       TEXT,
    start       TEXT NOT NULL,  -- JSON: {"workflow", "data", "timeout", "seed"}
    not_before  REAL NOT NULL,
    enqueued_at REAL NOT NULL,
    state       TEXT NOT NULL,  -- queued | started | ended | cancelled
    started_at  REAL,
    node        TEXT,
    item_order  INTEGER NOT NULL
);
CREATE INDEX queue_items_waiting ON queue_items (queue, priority, item_order) WHERE state = 'queued';
CREATE INDEX queue_items_started ON queue_items (queue) WHERE state = 'started';
CREATE INDEX queue_items_recent ON queue_items (queue, started_at) WHERE started_at IS NOT NULL;
CREATE INDEX queue_items_dedup ON queue_items (queue, dedup) WHERE dedup IS NOT NULL;

-- Each queue's newest configuration (Substrate(queues=...)): every node applies the newest registration, and a
-- wfsub.Client checks a queue's name against them.
CREATE TABLE queues (
    name       TEXT PRIMARY KEY,
    spec       TEXT NOT NULL,  -- JSON: {"concurrency", "per_node", "rate", "partitioned"}
    node       TEXT,  -- who registered it last
    updated_at REAL NOT NULL
);

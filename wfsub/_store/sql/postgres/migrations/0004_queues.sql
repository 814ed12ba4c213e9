-- Migration 4: queued cases.
--
-- A case started with new_case(..., queue=) waits here until its queue has room; a node claims it (state
-- 'started', started_at = the dequeue time, node) under an advisory lock on the queue's name, so the limits hold
-- across nodes, and starts it as any case. 'ended' marks a started item whose case has ended; 'cancelled' one
-- cancelled while it waited. See wfsub/_store/_queueing.py.
CREATE TABLE queue_items (
    case_id     text PRIMARY KEY,
    queue       text NOT NULL,
    part        text,  -- the partition key (NULL: none)
    priority    bigint NOT NULL,
    dedup       text,
    start       text NOT NULL,  -- JSON: {"workflow", "data", "timeout", "seed"}
    not_before  double precision NOT NULL,
    enqueued_at double precision NOT NULL,
    state       text NOT NULL,  -- queued | started | ended | cancelled
    started_at  double precision,
    node        text,
    item_order  bigint GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX queue_items_waiting ON queue_items (queue, priority, item_order) WHERE state = 'queued';
CREATE INDEX queue_items_started ON queue_items (queue) WHERE state = 'started';
CREATE INDEX queue_items_recent ON queue_items (queue, started_at) WHERE started_at IS NOT NULL;
CREATE INDEX queue_items_dedup ON queue_items (queue, dedup) WHERE dedup IS NOT NULL;

-- Each queue's newest configuration (Substrate(queues=...)): every node applies the newest registration, and a
-- wfsub.Client checks a queue's name against them.
CREATE TABLE queues (
    name       text PRIMARY KEY,
    spec       text NOT NULL,  -- JSON: {"concurrency", "per_node", "rate", "partitioned"}
    node       text,  -- who registered it last
    updated_at double precision NOT NULL
);

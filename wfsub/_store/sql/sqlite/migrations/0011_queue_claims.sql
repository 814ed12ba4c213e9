-- Migration 11: a claim reads only what may start now, however long a queue's backlog.
--
-- A claim once read the first thousand queued items of a queue in start order and chose among them: a thousand
-- cases of a full partition (one tenant's backlog), or a thousand cases queued with a delay, hid every item
-- behind them. Now an item is `due` once its delay has passed (at once without one; the claim marks those whose
-- time has come, through queue_items_delayed), and a claim reads only due items, of the partitions that have
-- room, as many as may start (queue_items_ready, and per partition queue_items_ready_parts): see
-- wfsub/_store/_queueing.py (`read_plan`). Partitions are indexed by coalesce(part, ''): the items without a
-- key are one partition, '' (a partition key is never empty), so one index path serves them too.
--
-- A queue item also follows its case to the owner that takes the file over (queue_items_follow_owner, in the
-- transaction that makes it the owner), so per_node counts what the owner runs; no table changes for that.
ALTER TABLE queue_items ADD COLUMN due INTEGER NOT NULL DEFAULT 0;  -- 1: queued and its delay has passed
UPDATE queue_items SET due = 1 WHERE state = 'queued' AND not_before <= enqueued_at;
DROP INDEX queue_items_waiting;
CREATE INDEX queue_items_ready ON queue_items (queue, priority, item_order) WHERE state = 'queued' AND due = 1;
CREATE INDEX queue_items_ready_parts ON queue_items (queue, coalesce(part, ''), priority, item_order)
    WHERE state = 'queued' AND due = 1;
CREATE INDEX queue_items_delayed ON queue_items (queue, not_before) WHERE state = 'queued' AND due = 0;

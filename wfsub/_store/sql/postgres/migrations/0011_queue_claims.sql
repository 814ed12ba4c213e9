-- Migration 11: a claim reads only what may start now, however long a queue's backlog; a queue item follows its
-- case to the node that takes it over.
--
-- A claim once read the first thousand queued items of a queue in start order and chose among them: a thousand
-- cases of a full partition (one tenant's backlog), or a thousand cases queued with a delay, hid every item
-- behind them. Now an item is `due` once its delay has passed (at once without one; the claim marks those whose
-- time has come, through queue_items_delayed), and a claim reads only due items, of the partitions that have
-- room, as many as may start (queue_items_ready, and per partition queue_items_ready_parts): see
-- wfsub/_store/_queueing.py (`read_plan`). Partitions are indexed by coalesce(part, ''): the items without a
-- key are one partition, '' (a partition key is never empty), so one index path serves them too.
ALTER TABLE queue_items ADD COLUMN due boolean NOT NULL DEFAULT false;  -- queued and its delay has passed
UPDATE queue_items SET due = true WHERE state = 'queued' AND not_before <= enqueued_at;
DROP INDEX queue_items_waiting;
CREATE INDEX queue_items_ready ON queue_items (queue, priority, item_order) WHERE state = 'queued' AND due;
CREATE INDEX queue_items_ready_parts ON queue_items (queue, coalesce(part, ''), priority, item_order)
    WHERE state = 'queued' AND due;
CREATE INDEX queue_items_delayed ON queue_items (queue, not_before) WHERE state = 'queued' AND NOT due;

-- A queue item follows its case to the node that takes it over: per_node counts the cases a node runs, not only
-- those it claimed itself (a node that took over a dead node's cases ran twice its share). take_over as in
-- migration 1, and the started items of the cases it takes move to p_node in the same transaction.
CREATE OR REPLACE FUNCTION take_over(p_node text, p_limit integer) RETURNS SETOF cases LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now double precision := db_now();
    v_expired text[];
    r record;
    v_taken text[] := '{}';
    v_losers text[] := '{}';
    v_loser text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM nodes WHERE node_id = p_node AND lease_until > v_now) THEN
        RAISE EXCEPTION 'the lease of node % has expired', p_node USING ERRCODE = 'WF001';
    END IF;
    v_expired := ARRAY(SELECT node_id FROM nodes WHERE lease_until <= v_now AND node_id <> p_node);
    IF cardinality(v_expired) = 0 THEN
        RETURN;
    END IF;
    FOR r IN
        WITH picked AS (
            SELECT c.case_id, c.owner FROM cases c
            WHERE c.ended_at IS NULL AND c.owner = ANY (v_expired)
            ORDER BY c.case_order LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        )
        UPDATE cases c SET owner = p_node, epoch = c.epoch + 1 FROM picked WHERE c.case_id = picked.case_id
        RETURNING c.case_id AS taken, picked.owner AS lost_by
    LOOP
        v_taken := v_taken || r.taken;
        IF NOT r.lost_by = ANY (v_losers) THEN
            v_losers := v_losers || r.lost_by;
        END IF;
    END LOOP;
    UPDATE queue_items q SET node = p_node WHERE q.case_id = ANY (v_taken) AND q.state = 'started';
    FOREACH v_loser IN ARRAY v_losers LOOP
        PERFORM notify_change(json_build_object('k', 't', 's', p_node, 'o', v_loser));
    END LOOP;
    RETURN QUERY SELECT * FROM cases c WHERE c.case_id = ANY (v_taken) ORDER BY c.case_order;
END
$$;

-- Migration 9: a case id a queue item waits for is that queued case's alone.
--
-- write_case refuses a write that starts a case (no row of it yet, its first record a `start`, or a fork's
-- `snapshot`) while a queue item of its id waits (queued, or claimed and its case not written yet), reporting
-- 'conflict' with info 'queue_item_waiting' and writing nothing; p_from_queue (new, last): the write is that
-- item's own start (CaseWrite.from_queue), which goes ahead. The check runs under a transaction-scoped advisory
-- lock on the case id, which queueing (queue_put) takes as well before it looks for a case of the id: whichever
-- commits first, the other then sees it (each statement of a plpgsql function reads afresh), so a start and a
-- queueing of one id never both commit. Otherwise as migration 1's.

DROP FUNCTION write_case(
    text, text, bigint, boolean, bigint[], text[], text[], text[], boolean, text, text, text, double precision,
    double precision, double precision, bigint, double precision, boolean, boolean, text, bigint, integer, integer,
    text, integer, bigint[], bigint[], text[], text
);

CREATE FUNCTION write_case(
    p_node text, p_case_id text, p_epoch bigint, p_queue boolean,
    p_seqs bigint[], p_kinds text[], p_request_ids text[], p_records text[],
    p_has_row boolean, p_workflow text, p_fingerprint text, p_state text, p_started_at double precision,
    p_updated_at double precision, p_ended_at double precision, p_last_seq bigint, p_next_due double precision,
    p_live boolean, p_parked boolean, p_detail text,
    p_snap_seq bigint, p_snap_format integer, p_snap_bytecode integer, p_snap_state text, p_snap_keep integer,
    p_inbox_done bigint[], p_refused_ids bigint[], p_refused_reasons text[], p_token text,
    p_from_queue boolean DEFAULT false,
    OUT status text, OUT appended boolean[], OUT info text, OUT at_seq bigint, OUT cur_owner text,
    OUT cur_epoch bigint
) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    found_case boolean;
    v_epoch bigint;
    i integer;
BEGIN
    IF p_token IS NOT NULL THEN
        INSERT INTO commits (token, at) VALUES (p_token, db_now());
    END IF;
    appended := '{}';
    SELECT c.owner, c.epoch INTO cur_owner, cur_epoch FROM cases c WHERE c.case_id = p_case_id FOR UPDATE;
    found_case := FOUND;
    IF NOT found_case AND NOT coalesce(p_from_queue, false) AND coalesce(p_kinds[1], '') IN ('start', 'snapshot') THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('wfsub case id ' || current_schema() || ' ' || p_case_id, 0));
        PERFORM 1 FROM queue_items q
        WHERE q.case_id = p_case_id AND q.state IN ('queued', 'started')
          AND NOT EXISTS (SELECT 1 FROM cases c WHERE c.case_id = q.case_id);
        IF FOUND THEN
            status := 'conflict';
            appended := NULL;
            info := 'queue_item_waiting';
            at_seq := 0;
            cur_owner := NULL;
            cur_epoch := NULL;
            RETURN;
        END IF;
    END IF;
    IF found_case AND NOT p_queue THEN
        IF cur_owner IS DISTINCT FROM p_node OR (p_epoch IS NOT NULL AND p_epoch <> cur_epoch) THEN
            status := 'fenced';
            RETURN;
        END IF;
        v_epoch := cur_epoch;
    ELSIF p_queue THEN
        v_epoch := 0;
    ELSE
        v_epoch := 1;
    END IF;
    BEGIN
        FOR i IN 1 .. coalesce(array_length(p_seqs, 1), 0) LOOP
            at_seq := p_seqs[i];
            INSERT INTO journal (case_id, seq, kind, request_id, epoch, record)
            VALUES (p_case_id, p_seqs[i], p_kinds[i], p_request_ids[i], v_epoch, p_records[i])
            ON CONFLICT (case_id, request_id) WHERE request_id IS NOT NULL DO NOTHING;
            appended := appended || FOUND;
            IF FOUND AND p_kinds[i] = 'end' THEN
                PERFORM notify_change(json_build_object(
                    'k', 'e', 's', p_node, 'c', CASE WHEN length(p_case_id) <= 1000 THEN p_case_id END
                ));
            END IF;
        END LOOP;
        at_seq := NULL;
        IF p_has_row THEN
            IF found_case THEN
                UPDATE cases SET
                    workflow = p_workflow, fingerprint = p_fingerprint, state = p_state, started_at = p_started_at,
                    updated_at = p_updated_at, ended_at = p_ended_at, last_seq = p_last_seq, next_due = p_next_due,
                    live = p_live, parked = p_parked, detail = p_detail
                WHERE case_id = p_case_id;
            ELSE
                INSERT INTO cases (case_id, workflow, fingerprint, state, started_at, updated_at, ended_at, last_seq,
                                   next_due, live, parked, detail, owner, epoch)
                VALUES (p_case_id, p_workflow, p_fingerprint, p_state, p_started_at, p_updated_at, p_ended_at,
                        p_last_seq, p_next_due, p_live, p_parked, p_detail,
                        CASE WHEN p_queue THEN NULL ELSE p_node END, v_epoch);
                IF p_queue THEN
                    PERFORM notify_change(json_build_object('k', 'q', 's', p_node, 'f', p_fingerprint));
                END IF;
            END IF;
        END IF;
        IF p_snap_seq IS NOT NULL THEN
            INSERT INTO snapshots (case_id, seq, format, bytecode, state)
            VALUES (p_case_id, p_snap_seq, p_snap_format, p_snap_bytecode, p_snap_state)
            ON CONFLICT (case_id, seq) DO UPDATE SET
                format = excluded.format, bytecode = excluded.bytecode, state = excluded.state;
            DELETE FROM snapshots s WHERE s.case_id = p_case_id AND s.seq < (
                SELECT min(k.seq) FROM (
                    SELECT t.seq FROM snapshots t WHERE t.case_id = p_case_id ORDER BY t.seq DESC LIMIT p_snap_keep
                ) k
            );
        END IF;
        IF coalesce(array_length(p_inbox_done, 1), 0) > 0 THEN
            DELETE FROM inbox WHERE id = ANY (p_inbox_done);
        END IF;
        IF coalesce(array_length(p_refused_ids, 1), 0) > 0 THEN
            UPDATE inbox SET refused = r.reason
            FROM unnest(p_refused_ids, p_refused_reasons) AS r(id, reason) WHERE inbox.id = r.id;
        END IF;
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS info = CONSTRAINT_NAME;
        status := 'conflict';
        appended := NULL;
        RETURN;
    END;
    status := 'ok';
    cur_owner := CASE WHEN p_queue THEN NULL ELSE p_node END;
    cur_epoch := v_epoch;
END
$$;

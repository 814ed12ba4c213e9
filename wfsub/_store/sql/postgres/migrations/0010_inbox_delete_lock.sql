-- Migration 10: an input put in the inbox and a `delete` of the same case serialize.
--
-- `delete` removes an ended case only when no input for it waits in the inbox. Before this layout it checked the
-- inbox on the snapshot its statement took before it waited for the case row's lock, and an input put took no
-- lock at all: an input committed while the delete waited was not seen, and was left for a case that was gone.
-- Now an input put holds a shared advisory lock on its case's key (`inbox_lock_key`) until it commits, and a
-- delete takes that key's lock exclusively once it holds the case row, then reads the inbox in a statement of its
-- own (a new snapshot: every input put before has committed, and every input put after waits for the delete and
-- finds no case). An advisory lock, not a lock on the case row: a put never waits for an owner's write of the
-- case (which holds the row, FOR UPDATE), so a group commit that writes one case and puts an input for another
-- never waits on another node's group. The delete never waits for the key while it holds the row (it tries the
-- key, and on failure lets the row go and waits for the key alone: see delete in _postgres.py), so a group that
-- puts an input for a case and then writes that case cannot deadlock with it.

-- The advisory lock key of a case's inbox inputs in this schema (two case ids may share a key: they then
-- serialize, which is harmless).
CREATE FUNCTION inbox_lock_key(p_case_id text) RETURNS bigint LANGUAGE sql STABLE AS $$
    SELECT hashtextextended('wfsub inbox ' || current_schema() || ' ' || p_case_id, 0)
$$;

-- An input from an outside writer, with a NOTIFY that names the case's owner (so only it wakes); it holds its
-- case's inbox key (shared) until its transaction ends.
CREATE OR REPLACE FUNCTION inbox_put(
    p_node text, p_case_id text, p_kind text, p_body text, p_request_id text, p_created_at double precision,
    p_token text
) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id bigint;
    v_owner text;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(inbox_lock_key(p_case_id));
    IF p_token IS NOT NULL THEN
        INSERT INTO commits (token, at) VALUES (p_token, db_now());
    END IF;
    INSERT INTO inbox (case_id, kind, body, request_id, created_at)
    VALUES (p_case_id, p_kind, p_body, p_request_id, p_created_at) RETURNING id INTO v_id;
    SELECT c.owner INTO v_owner FROM cases c WHERE c.case_id = p_case_id;
    PERFORM notify_change(json_build_object('k', 'i', 's', p_node, 'o', v_owner));
    RETURN v_id;
END
$$;

-- Migration 1: an empty schema to layout version 1, the first Postgres layout.
--
-- The store runs this file whole, as one script, inside the transaction that creates the schema, with
-- `search_path` set to the store's schema (so no name here is qualified). A new schema is built by running every
-- migration in order: one path to build a layout, the one that is tested. Never edit a released migration: add
-- the next numbered file. Every statement the store runs afterwards is in ../queries.sql.

-- What this schema is: ('application', 'wfsub') and ('version', N). The store refuses a schema that lacks the
-- first or whose version is newer than it knows.
CREATE TABLE meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

-- The nodes (Substrates) that own cases here: each holds a lease it renews; expiry is database time.
CREATE TABLE nodes (
    node_id     text PRIMARY KEY,
    pid         integer NOT NULL,
    host        text NOT NULL,
    since       double precision NOT NULL,  -- seconds since the epoch, database time
    lease_until double precision NOT NULL   -- the lease holds while the database clock is below this
);

-- One row per case (`CaseRow`), replaced in the same transaction as its records. `owner` and `epoch` fence
-- writes: each write locks this row and checks both (see write_case below).
CREATE TABLE cases (
    case_order  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,  -- `CaseRow.order`: assigned at insert
    case_id     text NOT NULL UNIQUE,
    workflow    text NOT NULL,
    fingerprint text NOT NULL,
    state       text NOT NULL,
    started_at  double precision NOT NULL,
    updated_at  double precision NOT NULL,
    ended_at    double precision,
    last_seq    bigint NOT NULL,
    next_due    double precision,
    live        boolean NOT NULL,  -- initializing, running, waiting_effect, or effects in flight
    parked      boolean NOT NULL,  -- waiting_signal or waiting_timer with no effect in flight
    detail      text NOT NULL,     -- JSON: at, signals, effects, timers, data, error, cancel_reason, suspended_reason
    owner       text,              -- the node that owns the case; NULL: queued for any node (placement="any")
    epoch       bigint NOT NULL    -- 1 when started (0 while queued), +1 at each takeover
);
CREATE INDEX cases_by_state ON cases (state, case_order);
CREATE INDEX cases_by_workflow ON cases (workflow, case_order);
CREATE INDEX cases_live ON cases (owner, case_order) WHERE live;
CREATE INDEX cases_due ON cases (owner, next_due) WHERE parked AND next_due IS NOT NULL;
CREATE INDEX cases_ended ON cases (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX cases_owned ON cases (owner, case_order) WHERE ended_at IS NULL;
CREATE INDEX cases_queued ON cases (fingerprint, case_order) WHERE owner IS NULL AND ended_at IS NULL;

-- The journal: every record of every case, in seq order per case, kept whole as JSON text. `epoch` is the
-- epoch of the node that appended it (fencing keeps a case's epochs non-decreasing along its seqs).
CREATE TABLE journal (
    case_id    text NOT NULL,
    seq        bigint NOT NULL,
    kind       text NOT NULL,
    request_id text,
    epoch      bigint NOT NULL,
    record     text NOT NULL,
    PRIMARY KEY (case_id, seq)
);
-- A retried input applies once: its request_id is unique within its case.
CREATE UNIQUE INDEX journal_request ON journal (case_id, request_id) WHERE request_id IS NOT NULL;
-- A case ends once.
CREATE UNIQUE INDEX journal_one_end ON journal (case_id) WHERE kind = 'end';

-- Machine snapshots; the store keeps the newest two per case.
CREATE TABLE snapshots (
    case_id  text NOT NULL,
    seq      bigint NOT NULL,
    format   integer NOT NULL,
    bytecode integer NOT NULL,
    state    text NOT NULL,
    PRIMARY KEY (case_id, seq)
);

-- Inputs written by anyone but the owner, until the owner moves them into a journal (or refuses them).
-- Ids increase, but with several writers they may commit out of order (see _postgres.py, inbox_take).
CREATE TABLE inbox (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    case_id    text NOT NULL,
    kind       text NOT NULL,
    body       text NOT NULL,
    request_id text,
    created_at double precision NOT NULL,
    refused    text
);
CREATE INDEX inbox_pending ON inbox (id) WHERE refused IS NULL;
CREATE INDEX inbox_by_case ON inbox (case_id);

-- One row per group commit (its first write records a random token): when a connection is lost before the
-- answer to a group came back, the store asks here whether that group committed. Old tokens are deleted.
CREATE TABLE commits (
    token text PRIMARY KEY,
    at    double precision NOT NULL
);

-- Database time, in seconds since the epoch: leases, takeovers and `database_time()` all read this clock.
CREATE FUNCTION db_now() RETURNS double precision LANGUAGE sql VOLATILE AS $$
    SELECT extract(epoch FROM clock_timestamp())::double precision
$$;

-- One NOTIFY on this schema's channel (`<schema>_changed`), delivered when the transaction commits.
-- The payload is JSON: {"k": kind, "s": sender node, ...}; kinds: i (inbox row, "o": the case's owner), e (an
-- `end`, "c": case id, null past 1,000 characters: a NOTIFY payload is at most 8,000 bytes), q (a queued case,
-- "f": fingerprint), t (a takeover, "o": the node that lost cases). Node ids are at most 200 characters.
CREATE FUNCTION notify_change(payload json) RETURNS void LANGUAGE sql VOLATILE AS $$
    SELECT pg_notify(current_schema() || '_changed', payload::text)
$$;

-- One write of a case (a `CaseWrite`), run by the group commit once per write, all in one transaction.
-- The case row is locked first (FOR UPDATE) and its owner and epoch checked: a write by a node that does not
-- own the case, or that carries another epoch, changes nothing and reports 'fenced' with the current owner and
-- epoch. The write itself runs in an exception block (a subtransaction): a write that breaks a rule of the
-- journal is undone alone and reports 'conflict' with the constraint and the seq; the other writes of the
-- group commit. p_queue: the start write of a case queued for any node (owner NULL, epoch 0).
CREATE FUNCTION write_case(
    p_node text, p_case_id text, p_epoch bigint, p_queue boolean,
    p_seqs bigint[], p_kinds text[], p_request_ids text[], p_records text[],
    p_has_row boolean, p_workflow text, p_fingerprint text, p_state text, p_started_at double precision,
    p_updated_at double precision, p_ended_at double precision, p_last_seq bigint, p_next_due double precision,
    p_live boolean, p_parked boolean, p_detail text,
    p_snap_seq bigint, p_snap_format integer, p_snap_bytecode integer, p_snap_state text, p_snap_keep integer,
    p_inbox_done bigint[], p_refused_ids bigint[], p_refused_reasons text[], p_token text,
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

-- An input from an outside writer, with a NOTIFY that names the case's owner (so only it wakes).
CREATE FUNCTION inbox_put(
    p_node text, p_case_id text, p_kind text, p_body text, p_request_id text, p_created_at double precision,
    p_token text
) RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id bigint;
    v_owner text;
BEGIN
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

-- Cases of nodes whose lease has expired move to p_node, their epochs bumped; at most p_limit, never a case
-- another taker holds locked (SKIP LOCKED). p_node's own lease must be live. Each node that lost cases is told
-- (NOTIFY 't'). The expired nodes are listed first and the cases picked by `owner = ANY (...)`, with no join:
-- a row another taker updated meanwhile is re-checked on its new version (owner is no longer an expired node),
-- which a join to `nodes` would re-check against the old joined row.
CREATE FUNCTION take_over(p_node text, p_limit integer) RETURNS SETOF cases LANGUAGE plpgsql VOLATILE AS $$
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
    FOREACH v_loser IN ARRAY v_losers LOOP
        PERFORM notify_change(json_build_object('k', 't', 's', p_node, 'o', v_loser));
    END LOOP;
    RETURN QUERY SELECT * FROM cases c WHERE c.case_id = ANY (v_taken) ORDER BY c.case_order;
END
$$;

-- Cases queued for any node (owner NULL) whose fingerprint is one of p_fingerprints go to p_node, oldest
-- first, at most p_limit, never one another claimer holds locked (SKIP LOCKED). p_node's own lease must be live.
CREATE FUNCTION claim_queued(p_node text, p_fingerprints text[], p_limit integer) RETURNS SETOF text
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM nodes WHERE node_id = p_node AND lease_until > db_now()) THEN
        RAISE EXCEPTION 'the lease of node % has expired', p_node USING ERRCODE = 'WF001';
    END IF;
    RETURN QUERY
    WITH picked AS (
        SELECT c.case_id FROM cases c
        WHERE c.owner IS NULL AND c.ended_at IS NULL AND c.fingerprint = ANY (p_fingerprints)
        ORDER BY c.case_order LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE cases c SET owner = p_node, epoch = c.epoch + 1 FROM picked WHERE c.case_id = picked.case_id
    RETURNING c.case_id;
END
$$;

-- Migration 7: the case lifecycle: tags and the origin of forked cases (listing, status), and retried cases.
--
-- A case's tags ({str: str}) and the case it was forked from are fields of its `start` record, the source of
-- truth. When a case row is first inserted (its `start` record is always written before it, in the same
-- transaction), a trigger copies them into the row's `tags` and `forked_from` columns and each tag into
-- `case_tags`, the index `cases(tags=...)` reads. Rows written before this layout read as untagged. Replacing a
-- row (`case_put`) never touches these columns; deleting a row deletes its tags.

ALTER TABLE cases ADD COLUMN tags TEXT;         -- JSON {key: value} of the start record's `tags` (NULL: none)
ALTER TABLE cases ADD COLUMN forked_from TEXT;  -- the id of the case this one was forked from (NULL: not a fork)

CREATE TABLE case_tags (
    case_id TEXT NOT NULL,
    key     TEXT NOT NULL,
    value   TEXT NOT NULL,
    PRIMARY KEY (case_id, key)
) WITHOUT ROWID;
CREATE INDEX case_tags_by_value ON case_tags (key, value, case_id);

CREATE TRIGGER cases_tags_from_start AFTER INSERT ON cases
BEGIN
    UPDATE cases SET
        tags = (SELECT json_extract(j.record, '$.tags') FROM journal j WHERE j.case_id = NEW.case_id AND j.seq = 0),
        forked_from = (SELECT json_extract(j.record, '$.forked_from.case_id') FROM journal j
                       WHERE j.case_id = NEW.case_id AND j.seq = 0)
    WHERE case_order = NEW.case_order;
    INSERT OR REPLACE INTO case_tags (case_id, key, value)
    SELECT NEW.case_id, t.key, t.value
    FROM journal j, json_each(j.record, '$.tags') t
    WHERE j.case_id = NEW.case_id AND j.seq = 0 AND t.type = 'text';
END;

CREATE TRIGGER cases_tags_gone AFTER DELETE ON cases
BEGIN
    DELETE FROM case_tags WHERE case_id = OLD.case_id;
END;

-- `cases(id_prefix=...)`, `cases(started_after=..., started_before=...)`.
CREATE INDEX cases_by_started ON cases (started_at);

-- A case ends once per run: a `retry` record re-opens a failed case, and the `end` of each later run carries
-- `run` (the retries so far), so the unique index on ends is by case and run.
DROP INDEX journal_one_end;
CREATE UNIQUE INDEX journal_one_end ON journal (case_id, coalesce(json_extract(record, '$.run'), 0)) WHERE kind = 'end';

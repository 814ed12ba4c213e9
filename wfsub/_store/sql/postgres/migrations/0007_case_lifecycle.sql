-- Migration 7: the case lifecycle: tags and the origin of forked cases (listing, status), and retried cases.
--
-- A case's tags ({str: str}) and the case it was forked from are fields of its `start` record, the source of
-- truth. When a case row is first inserted (its `start` record is always written before it, in the same
-- transaction: see write_case), a trigger copies them into the row's `tags` (jsonb, GIN-indexed for
-- `tags @> ...`) and `forked_from` columns. Rows written before this layout read as untagged; updates of a row
-- never touch these columns.

ALTER TABLE cases ADD COLUMN tags jsonb;        -- the start record's `tags` (NULL: none)
ALTER TABLE cases ADD COLUMN forked_from text;  -- the id of the case this one was forked from (NULL: not a fork)
CREATE INDEX cases_by_tags ON cases USING gin (tags jsonb_path_ops) WHERE tags IS NOT NULL;
CREATE INDEX cases_by_started ON cases (started_at);
CREATE INDEX cases_by_id ON cases (case_id text_pattern_ops);

CREATE FUNCTION cases_tags_from_start() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    start jsonb;
BEGIN
    SELECT j.record::jsonb INTO start FROM journal j WHERE j.case_id = NEW.case_id AND j.seq = 0;
    IF start IS NOT NULL THEN
        IF jsonb_typeof(start -> 'tags') = 'object' THEN
            NEW.tags := start -> 'tags';
        END IF;
        NEW.forked_from := start -> 'forked_from' ->> 'case_id';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER cases_tags_from_start BEFORE INSERT ON cases
FOR EACH ROW EXECUTE FUNCTION cases_tags_from_start();

-- A case ends once per run: a `retry` record re-opens a failed case, and the `end` of each later run carries
-- `run` (the retries so far), so the unique index on ends is by case and run.
DROP INDEX journal_one_end;
CREATE UNIQUE INDEX journal_one_end ON journal (case_id, (coalesce((record::jsonb ->> 'run')::bigint, 0)))
WHERE kind = 'end';

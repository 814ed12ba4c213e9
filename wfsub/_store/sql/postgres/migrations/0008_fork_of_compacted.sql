-- Migration 8: a row's tags and origin come from the first record of its journal, whichever it is.
--
-- A fork of a compacted journal starts at the origin's `snapshot` record (seq > 0), whose `start` field holds
-- the start record (with the fork's `forked_from` and the origin's tags); no record of it has seq 0. The trigger
-- of migration 7 read seq 0 only, so such a fork lost its origin and tags. Now it reads the journal's first
-- record: a `start`'s own fields, or a `snapshot`'s `start`. Rows written before this layout whose journal
-- starts with a `snapshot` and that read as untagged and not forked are filled in from it (a fork made at a
-- snapshot record before this layout kept `forked_from` on the record itself: read from there too).

CREATE OR REPLACE FUNCTION cases_tags_from_start() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    first jsonb;
    start jsonb;
BEGIN
    SELECT j.record::jsonb INTO first FROM journal j WHERE j.case_id = NEW.case_id ORDER BY j.seq LIMIT 1;
    start := CASE WHEN first ->> 'kind' = 'snapshot' THEN first -> 'start' ELSE first END;
    IF start IS NOT NULL THEN
        IF jsonb_typeof(start -> 'tags') = 'object' THEN
            NEW.tags := start -> 'tags';
        END IF;
        NEW.forked_from := start -> 'forked_from' ->> 'case_id';
    END IF;
    RETURN NEW;
END
$$;

UPDATE cases c SET
    tags = CASE WHEN jsonb_typeof(f.record -> 'start' -> 'tags') = 'object' THEN f.record -> 'start' -> 'tags' END,
    forked_from = coalesce(f.record -> 'start' -> 'forked_from' ->> 'case_id', f.record -> 'forked_from' ->> 'case_id')
FROM (
    SELECT DISTINCT ON (j.case_id) j.case_id, j.kind, j.record::jsonb AS record
    FROM journal j ORDER BY j.case_id, j.seq
) f
WHERE f.case_id = c.case_id AND f.kind = 'snapshot' AND c.tags IS NULL AND c.forked_from IS NULL;

-- Migration 8: a row's tags and origin come from the first record of its journal, whichever it is.
--
-- A fork of a compacted journal starts at the origin's `snapshot` record (seq > 0), whose `start` field holds
-- the start record (with the fork's `forked_from` and the origin's tags); no record of it has seq 0. The trigger
-- of migration 7 read seq 0 only, so such a fork lost its origin and tags. Now it reads the journal's first
-- record: a `start`'s own fields, or a `snapshot`'s `start`. Rows written before this layout whose journal
-- starts with a `snapshot` and that read as untagged and not forked are filled in from it (a fork made at a
-- snapshot record before this layout kept `forked_from` on the record itself: read from there too).

DROP TRIGGER cases_tags_from_start;

CREATE TRIGGER cases_tags_from_start AFTER INSERT ON cases
BEGIN
    UPDATE cases SET
        tags = (SELECT json_extract(j.record, CASE WHEN j.kind = 'snapshot' THEN '$.start.tags' ELSE '$.tags' END)
                FROM journal j WHERE j.case_id = NEW.case_id ORDER BY j.seq LIMIT 1),
        forked_from = (SELECT json_extract(j.record, CASE WHEN j.kind = 'snapshot'
                                                          THEN '$.start.forked_from.case_id'
                                                          ELSE '$.forked_from.case_id' END)
                       FROM journal j WHERE j.case_id = NEW.case_id ORDER BY j.seq LIMIT 1)
    WHERE case_order = NEW.case_order;
    INSERT OR REPLACE INTO case_tags (case_id, key, value)
    SELECT NEW.case_id, t.key, t.value
    FROM (SELECT j.record, j.kind FROM journal j WHERE j.case_id = NEW.case_id ORDER BY j.seq LIMIT 1) f,
         json_each(f.record, CASE WHEN f.kind = 'snapshot' THEN '$.start.tags' ELSE '$.tags' END) t
    WHERE t.type = 'text';
END;

UPDATE cases SET
    tags = (SELECT json_extract(j.record, '$.start.tags') FROM journal j
            WHERE j.case_id = cases.case_id ORDER BY j.seq LIMIT 1),
    forked_from = (SELECT coalesce(json_extract(j.record, '$.start.forked_from.case_id'),
                                   json_extract(j.record, '$.forked_from.case_id'))
                   FROM journal j WHERE j.case_id = cases.case_id ORDER BY j.seq LIMIT 1)
WHERE tags IS NULL AND forked_from IS NULL
  AND (SELECT j.kind FROM journal j WHERE j.case_id = cases.case_id ORDER BY j.seq LIMIT 1) = 'snapshot';

INSERT OR REPLACE INTO case_tags (case_id, key, value)
SELECT c.case_id, t.key, t.value
FROM cases c, json_each(c.tags) t
WHERE c.tags IS NOT NULL AND t.type = 'text'
  AND NOT EXISTS (SELECT 1 FROM case_tags k WHERE k.case_id = c.case_id);

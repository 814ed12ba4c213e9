-- Migration 6: the parent of a child case (`start_case`), for `cases(parent=)`.
--
-- The parent's id is kept in the row's detail JSON (written with every row, so nothing else changes how a row is
-- written); this column reads it out, and the index lists a parent's children newest first. A row written
-- before this layout has no parent.
ALTER TABLE cases ADD COLUMN parent TEXT GENERATED ALWAYS AS (detail ->> '$.parent') VIRTUAL;
CREATE INDEX cases_by_parent ON cases (parent, case_order) WHERE parent IS NOT NULL;

-- Migration 6: the parent of a child case (`start_case`), for `cases(parent=)`.
--
-- The parent's id is kept in the row's detail JSON (written with every row, so nothing else changes how a row is
-- written); this column reads it out, and the index lists a parent's children newest first. A row written
-- before this layout has no parent.
-- A row whose detail is damaged (not JSON) reads as having no parent: the index must not make its writes fail.
ALTER TABLE cases ADD COLUMN parent TEXT
    GENERATED ALWAYS AS (CASE WHEN json_valid(detail) THEN detail ->> '$.parent' END) VIRTUAL;
CREATE INDEX cases_by_parent ON cases (parent, case_order) WHERE parent IS NOT NULL;

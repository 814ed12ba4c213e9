-- Migration 6: the parent of a child case (`start_case`), for `cases(parent=)`.
--
-- The parent's id is kept in the row's detail JSON (written with every row, so the write function is unchanged);
-- this column reads it out when a row is written, and the index lists a parent's children newest first. A row
-- written before this layout has no parent.
ALTER TABLE cases ADD COLUMN parent text GENERATED ALWAYS AS ((detail::jsonb) ->> 'parent') STORED;
CREATE INDEX cases_by_parent ON cases (parent, case_order) WHERE parent IS NOT NULL;

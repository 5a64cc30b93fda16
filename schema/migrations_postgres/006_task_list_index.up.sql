-- tasks/list (2025-11-25) pages through one principal's tasks by call id;
-- without this it walked the calls table by primary key, every call of
-- every principal, to find them.
CREATE INDEX calls_task_principal ON calls (principal, id) WHERE task_id IS NOT NULL;

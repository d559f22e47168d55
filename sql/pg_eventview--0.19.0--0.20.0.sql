-- pg_eventview 0.19.0 -> 0.20.0
\echo Use "ALTER EXTENSION pg_eventview UPDATE TO '0.20.0'" to load this file. \quit
-- A DROP SCHEMA ... CASCADE or DROP OWNED that takes a partition of an event table along while
-- the table stays is checked as a DROP TABLE of that partition is (partitions::before_removal).
DROP EVENT TRIGGER eventview_before_partition_removal;
CREATE EVENT TRIGGER eventview_before_partition_removal ON ddl_command_start
    WHEN TAG IN ('DROP TABLE', 'ALTER TABLE', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION eventview._before_partition_removal();

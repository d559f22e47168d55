\set VERBOSITY terse
-- schedule, run_maintenance, prune.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('ops', retention => '30 days', delta_retention => '1 hour');
SELECT eventview.create_view('ops_daily', 'ops', measures => '{"n": "count(*)"}', time_bucket => '1 day');
SELECT eventview.create_view('ops_manual', 'ops', measures => '{"n": "count(*)"}');
SELECT eventview.schedule('ops_daily', '1 minute');
SELECT name, schedule FROM eventview.views WHERE source = 'ops'::regclass ORDER BY name::text;
INSERT INTO ops (event_type, occurred_at, payload) VALUES
  ('a', now() - interval '90 days', '{}'),
  ('a', now() - interval '60 days', '{}'),
  ('a', now() - interval '1 day', '{}');
-- Only the scheduled view is refreshed by run_maintenance.
SELECT eventview.run_maintenance();
SELECT name, pending_changes, last_refresh_at IS NOT NULL AS refreshed FROM eventview.views
WHERE source = 'ops'::regclass ORDER BY name::text;
SELECT sum(n) FROM ops_daily;
-- run_maintenance also pruned: the two events past the 30-day retention are gone from the table,
-- but the view that had applied them keeps counting them.
SELECT count(*) AS events_left FROM ops;
-- It is not due again until its interval elapsed.
INSERT INTO ops (event_type, payload) VALUES ('a', '{}');
SELECT eventview.run_maintenance();
SELECT pending_changes FROM eventview.views WHERE name = 'ops_daily'::regclass;

-- prune: raw events past retention go, without retracting them from views.
-- Changelog records go only when every view has applied them and they are older than delta_retention.
SELECT eventview.prune('ops') AS pruned;
SELECT eventview.refresh('ops_daily');
SELECT sum(n) AS still_counted FROM ops_daily;
-- rebuild starts at the retention horizon (with a NOTICE): the pruned days keep their counts.
SELECT eventview.rebuild('ops_daily') > 0 AS rebuilt;
SELECT sum(n) AS still_counted_after_rebuild FROM ops_daily;
SELECT eventview.refresh('ops_manual');
SELECT sum(n) AS manual_counted FROM ops_manual;
-- A view without buckets can only be rebuilt whole, from what retention left: said with a WARNING.
SELECT eventview.rebuild('ops_manual') AS groups;
-- A view that had not applied the pruned events yet never sees them: it agrees with the table.
-- Age the changelog: now everything applied by every view and old enough goes.
DO $$ BEGIN
  EXECUTE format('UPDATE eventview._changes_%s SET logged_at = logged_at - interval ''2 hours''',
                 (SELECT source_id FROM eventview._sources WHERE relid = 'ops'::regclass));
END $$;
INSERT INTO ops (event_type, payload) VALUES ('a', '{}');
SELECT eventview.prune('ops') AS pruned;
SELECT pending_changes FROM eventview.views WHERE name = 'ops_manual'::regclass;
SELECT eventview.refresh('ops_manual');
SELECT sum(n) AS manual_counted FROM ops_manual;

-- One call prunes at most eventview.prune_max_rows rows per table (changelog and raw events
-- each), so a backlog drains over several bounded transactions.
INSERT INTO ops (event_type, payload) SELECT 'a', '{}' FROM generate_series(1, 2500);
UPDATE ops SET payload = '{"v": 1}' WHERE event_type = 'a';
SELECT eventview.refresh_all() > 0 AS applied;
DO $$ BEGIN
  EXECUTE format('UPDATE eventview._changes_%s SET logged_at = logged_at - interval ''2 hours''',
                 (SELECT source_id FROM eventview._sources WHERE relid = 'ops'::regclass));
END $$;
SET eventview.prune_max_rows = 1000;
SELECT eventview.prune('ops') AS pruned;
SELECT eventview.prune('ops') AS pruned_next;
SELECT eventview.prune('ops') AS pruned_last;
SELECT eventview.prune('ops') AS nothing_left;
RESET eventview.prune_max_rows;

-- A failing view records its error; the others keep refreshing.
SELECT eventview.create_view('ops_strict', 'ops', measures => '{"s": "sum($.v)"}', on_type_error => 'fail');
SELECT eventview.schedule('ops_strict', '1 second');
SELECT eventview.schedule('ops_manual', '1 second');
INSERT INTO ops (event_type, payload) VALUES ('a', '{"v": "oops"}');
SELECT pg_sleep(1.1);
SELECT eventview.run_maintenance();
SELECT name, pending_changes, last_error FROM eventview.views
WHERE name IN ('ops_strict'::regclass, 'ops_manual'::regclass) ORDER BY name::text;
-- A view that keeps failing backs off: the n-th failure in a row waits schedule * 2^(n-1)
-- (at most max(schedule, 1 hour)) before the next try. Time passing is simulated by moving
-- retry_at into the past.
SELECT eventview.schedule('ops_strict', '10 minutes');
CREATE FUNCTION backoff_state() RETURNS TABLE (failures integer, minutes_to_retry numeric) LANGUAGE sql AS $$
  SELECT failures, round(extract(epoch FROM retry_at - clock_timestamp()) / 60)
  FROM eventview._views WHERE relid = 'ops_strict'::regclass $$;
SELECT * FROM backoff_state();
SELECT eventview.run_maintenance();
SELECT * FROM backoff_state();
UPDATE eventview._views SET retry_at = now() - interval '1 second' WHERE relid = 'ops_strict'::regclass;
SELECT eventview.run_maintenance();
SELECT * FROM backoff_state();
UPDATE eventview._views SET retry_at = now() - interval '1 second', failures = 9 WHERE relid = 'ops_strict'::regclass;
SELECT eventview.run_maintenance();
SELECT * FROM backoff_state();
-- Not due yet: run_maintenance leaves it alone.
SELECT eventview.run_maintenance();
SELECT * FROM backoff_state();
-- A new schedule ends the backoff (a retry time of 'infinity', from a schedule of 100 years or more,
-- would outlive any other).
UPDATE eventview._views SET retry_at = 'infinity', failures = 3 WHERE relid = 'ops_strict'::regclass;
SELECT eventview.schedule('ops_strict', '10 minutes');
SELECT failures, retry_at FROM eventview._views WHERE relid = 'ops_strict'::regclass;
-- So does a successful refresh.
SELECT eventview.alter_view('ops_strict', on_type_error => 'skip');
SELECT eventview.refresh('ops_strict');
SELECT * FROM backoff_state();

-- Refusals.
SELECT try($$SELECT eventview.schedule('ops_daily', '-1 minute')$$);
SELECT try($$SELECT eventview.schedule('nope', '1 minute')$$);
SELECT try($$SELECT eventview.prune('nope')$$);
SELECT eventview.schedule('ops_daily', NULL);
SELECT schedule FROM eventview.views WHERE name = 'ops_daily'::regclass;

-- A table whose own DELETE trigger fails does not stop maintenance: its pruning is skipped
-- with a WARNING, the other tables are pruned and the views refreshed; pruning that table by
-- name reports the error.
SELECT eventview.create_event_table('ops_stubborn', retention => '1 day');
INSERT INTO ops_stubborn (event_type, occurred_at, payload) VALUES ('a', now() - interval '2 days', '{}');
CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'this table keeps its rows'; END $$;
CREATE TRIGGER keep BEFORE DELETE ON ops_stubborn FOR EACH ROW EXECUTE FUNCTION refuse_delete();
INSERT INTO ops (event_type, occurred_at, payload) VALUES ('a', now() - interval '40 days', '{}');
SELECT eventview.prune() > 0 AS pruned_the_others;
SELECT count(*) AS stubborn_rows_kept FROM ops_stubborn;
SELECT try($$SELECT eventview.prune('ops_stubborn')$$);
SELECT eventview.drop_event_table('ops_stubborn');

-- A table without views: run_maintenance still moves its field observer on, so its changelog
-- can be pruned.
SELECT eventview.create_event_table('ops_viewless', delta_retention => '1 hour');
INSERT INTO ops_viewless (event_type, payload) VALUES ('a', '{"x": 1}'), ('b', '{"y": "z"}');
SELECT eventview.run_maintenance();
SELECT event_type, path FROM eventview.observed_fields WHERE source = 'ops_viewless'::regclass ORDER BY 1, 2;
DO $$ BEGIN
  EXECUTE format('UPDATE eventview._changes_%s SET logged_at = logged_at - interval ''2 hours''',
                 (SELECT source_id FROM eventview._sources WHERE relid = 'ops_viewless'::regclass));
END $$;
SELECT eventview.prune('ops_viewless') AS pruned;
SELECT eventview.drop_event_table('ops_viewless');

-- delta_retention => '0 seconds': what every consumer has applied goes at the next prune (in a
-- later transaction than the change's); what a view has not applied stays. Below zero is refused.
SELECT eventview.create_event_table('ops_no_delay', delta_retention => '0 seconds');
SELECT delta_retention FROM eventview.event_tables WHERE name = 'ops_no_delay'::regclass;
SELECT eventview.create_view('no_delay_n', 'ops_no_delay', measures => '{"n": "count(*)"}');
INSERT INTO ops_no_delay (event_type, payload) VALUES ('a', '{}'), ('a', '{}');
INSERT INTO ops_no_delay (event_type, payload) VALUES ('a', '{}');
SELECT eventview.prune('ops_no_delay') AS pruned_before_the_refresh;
SELECT eventview.refresh('no_delay_n');
INSERT INTO ops_no_delay (event_type, payload) VALUES ('a', '{}');
SELECT eventview.prune('ops_no_delay') AS pruned_the_applied;
SELECT pending_changes FROM eventview.event_tables WHERE name = 'ops_no_delay'::regclass;
SELECT eventview.refresh('no_delay_n');
SELECT n FROM no_delay_n;
SELECT try($$SELECT eventview.create_event_table('ops_negative', delta_retention => '-1 second')$$);
SELECT eventview.drop_event_table('ops_no_delay', cascade => true);

-- refresh_all refreshes each view on its own: one that fails (here its type policy is 'fail')
-- keeps its error in last_error, with a WARNING, and applies nothing; the others go on.
SELECT eventview.create_event_table('ops_mixed');
SELECT eventview.create_view('mixed_fails', 'ops_mixed', measures => '{"q": "sum($.qty)"}', on_type_error => 'fail');
SELECT eventview.create_view('mixed_goes_on', 'ops_mixed', measures => '{"n": "count(*)"}');
INSERT INTO ops_mixed (event_type, payload) VALUES ('a', '{"qty": 1}'), ('a', '{"qty": "two"}');
SELECT eventview.refresh_all() >= 2 AS applied;
SELECT name, pending_changes, last_error FROM eventview.views
WHERE name IN ('mixed_fails'::regclass, 'mixed_goes_on'::regclass) ORDER BY name::text;
SELECT n FROM mixed_goes_on;
DELETE FROM ops_mixed WHERE payload ->> 'qty' = 'two';
SELECT eventview.refresh_all() >= 3 AS applied;
SELECT name, pending_changes, last_error FROM eventview.views
WHERE name IN ('mixed_fails'::regclass, 'mixed_goes_on'::regclass) ORDER BY name::text;
SELECT q FROM mixed_fails;
SELECT eventview.drop_event_table('ops_mixed', cascade => true);

\set VERBOSITY terse
-- Buckets in local wall-clock time (API.md section 8): bucket = date_bin(time_bucket,
-- occurred_at AT TIME ZONE time_zone, timestamp '2000-01-01') AT TIME ZONE time_zone.
SET TimeZone = 'UTC';
SELECT eventview.create_event_table('tz_ev');
-- Refused (22023): an unknown zone, an offset, a zone without time_bucket.
\set VERBOSITY default
SELECT eventview.create_view('tz_bad', 'tz_ev', time_bucket => '1 day', time_zone => 'Mars/Olympus');
SELECT eventview.create_view('tz_bad', 'tz_ev', time_bucket => '1 day', time_zone => '+02');
SELECT eventview.create_view('tz_bad', 'tz_ev', time_zone => 'Europe/Berlin');
\set VERBOSITY terse
SELECT to_regclass('tz_bad') IS NULL AS nothing_made;
-- Berlin: 2026-03-29 lasts 23 hours (02:00 CET -> 03:00 CEST), 2026-10-25 25 hours (03:00 CEST
-- -> 02:00 CET). Sydney: 2026-04-05 lasts 25 hours (03:00 AEDT -> 02:00 AEST), 2026-10-04 23
-- hours (02:00 AEST -> 03:00 AEDT). The zone name is matched as PostgreSQL matches it, and kept
-- as pg_timezone_names spells it.
SELECT eventview.create_view('berlin_daily', 'tz_ev', measures => '{"n": "count(*)", "first": "min(occurred_at)", "last": "max(occurred_at)"}',
                             time_bucket => '1 day', time_zone => 'europe/berlin');
SELECT eventview.create_view('sydney_daily', 'tz_ev', measures => '{"n": "count(*)"}',
                             time_bucket => '1 day', time_zone => 'Australia/Sydney', realtime => true);
SELECT eventview.create_view('berlin_hourly', 'tz_ev', measures => '{"n": "count(*)"}',
                             time_bucket => '1 hour', time_zone => 'Europe/Berlin');
SELECT definition -> 'time_zone' AS time_zone, definition -> 'time_bucket' AS time_bucket
FROM eventview.views WHERE name = 'berlin_daily'::regclass;
INSERT INTO tz_ev (event_type, occurred_at, payload) VALUES
  -- Berlin, around the spring change: local 2026-03-28 23:30 CET, 03-29 00:30 CET, 03-29 03:30 CEST,
  -- 03-29 23:30 CEST, 03-30 00:30 CEST.
  ('e', '2026-03-28 22:30+00', '{}'), ('e', '2026-03-28 23:30+00', '{}'), ('e', '2026-03-29 01:30+00', '{}'),
  ('e', '2026-03-29 21:30+00', '{}'), ('e', '2026-03-29 22:30+00', '{}'),
  -- Berlin, the repeated hour of the autumn change: local 02:30 CEST, then 02:30 CET.
  ('e', '2026-10-25 00:30+00', '{}'), ('e', '2026-10-25 01:30+00', '{}'),
  -- Berlin, the last hour of the 25-hour day: local 2026-10-25 23:30 CET.
  ('e', '2026-10-25 22:30+00', '{}'),
  -- Sydney, the 25-hour 2026-04-05: local 00:30 AEDT, 02:30 AEDT, 02:30 AEST, 23:30 AEST.
  ('e', '2026-04-04 13:30+00', '{}'), ('e', '2026-04-04 15:30+00', '{}'), ('e', '2026-04-04 16:30+00', '{}'),
  ('e', '2026-04-05 13:30+00', '{}'),
  -- Sydney, the 23-hour 2026-10-04: local 00:30 AEST, 03:30 AEDT, 23:30 AEDT.
  ('e', '2026-10-03 14:30+00', '{}'), ('e', '2026-10-03 16:30+00', '{}'), ('e', '2026-10-04 12:30+00', '{}');
-- Realtime: the pending events are in their local buckets before any refresh.
SELECT bucket, bucket AT TIME ZONE 'Australia/Sydney' AS local_start, n FROM sydney_daily ORDER BY bucket;
SELECT eventview.refresh_all() > 0 AS applied;
-- Each day starts at local midnight; the day of a change lasts 23 or 25 hours.
SELECT bucket, bucket AT TIME ZONE 'Europe/Berlin' AS local_start,
       lead(bucket) OVER (ORDER BY bucket) - bucket AS until_next, n, first, last
FROM berlin_daily ORDER BY bucket;
SELECT bucket, bucket AT TIME ZONE 'Australia/Sydney' AS local_start, n FROM sydney_daily ORDER BY bucket;
-- The two local 02:30 of 2026-10-25 are one local hour, one bucket.
SELECT bucket, bucket AT TIME ZONE 'Europe/Berlin' AS local_start, n
FROM berlin_hourly WHERE bucket >= '2026-10-24 22:00+00' AND bucket < '2026-10-26 00:00+00' ORDER BY bucket;
-- Every view equals the formula from scratch.
SELECT count(*) AS differences FROM (
  (SELECT bucket, n FROM berlin_daily EXCEPT
   SELECT date_bin('1 day', occurred_at AT TIME ZONE 'Europe/Berlin', timestamp '2000-01-01') AT TIME ZONE 'Europe/Berlin', count(*)
   FROM tz_ev GROUP BY 1)
  UNION ALL
  (SELECT bucket, n FROM berlin_hourly EXCEPT
   SELECT date_bin('1 hour', occurred_at AT TIME ZONE 'Europe/Berlin', timestamp '2000-01-01') AT TIME ZONE 'Europe/Berlin', count(*)
   FROM tz_ev GROUP BY 1)
  UNION ALL
  (SELECT bucket, n FROM sydney_daily EXCEPT
   SELECT date_bin('1 day', occurred_at AT TIME ZONE 'Australia/Sydney', timestamp '2000-01-01') AT TIME ZONE 'Australia/Sydney', count(*)
   FROM tz_ev GROUP BY 1)) d;
-- A rebuild window is of bucket starts. The local hour 02:00 of 2026-10-25 in Berlin starts at
-- 01:00 UTC (the later of the two instants), after its first event (00:30 UTC): a rebuild of
-- that one bucket still finds both. The 25-hour local day is recomputed whole.
SELECT eventview.rebuild('berlin_hourly', '2026-10-25 01:00+00', '2026-10-25 02:00+00') AS groups_written;
SELECT bucket, n FROM berlin_hourly WHERE bucket = '2026-10-25 01:00+00';
SELECT eventview.rebuild('berlin_daily', '2026-10-24 22:00+00', '2026-10-25 23:00+00') AS groups_written;
SELECT bucket, n, first, last FROM berlin_daily WHERE bucket >= '2026-10-24' ORDER BY bucket;
SELECT eventview.drop_event_table('tz_ev', cascade => true);

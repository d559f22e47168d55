ALTER TABLE eventview._changes_2 RENAME TO _changes_2_default;

ALTER TABLE eventview._changes_2_default ALTER COLUMN seq DROP IDENTITY;

CREATE TABLE eventview._changes_2 (
    seq               bigint GENERATED ALWAYS AS IDENTITY,
    xid               xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    logged_at         timestamptz NOT NULL DEFAULT pg_catalog.now(),
    op                "char" NOT NULL,
    event_ids         bigint[],
    event_id          bigint,
    old_event_type    text,
    old_event_version integer,
    old_producer      text,
    old_occurred_at   timestamptz,
    old_payload       jsonb
) PARTITION BY RANGE (seq);

ALTER TABLE eventview._changes_2 ALTER COLUMN event_ids SET STORAGE EXTERNAL;

CREATE INDEX ON eventview._changes_2 (xid, seq);

REVOKE ALL ON eventview._changes_2 FROM PUBLIC;

ALTER TABLE eventview._changes_2 ALTER COLUMN seq RESTART WITH 12345;

ALTER TABLE eventview._changes_2 ATTACH PARTITION eventview._changes_2_default DEFAULT;

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

CREATE TABLE eventview._changes_2_default PARTITION OF eventview._changes_2 DEFAULT;

CREATE TABLE eventview._changes_2_from_1 PARTITION OF eventview._changes_2 FOR VALUES FROM (1) TO (10001);

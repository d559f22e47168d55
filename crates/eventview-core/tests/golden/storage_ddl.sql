CREATE TABLE eventview._v3_data (
    __k boolean NOT NULL DEFAULT true,
    bucket timestamptz NOT NULL,
    g1 text NOT NULL,
    g1_null boolean NOT NULL,
    g2 text NOT NULL,
    g2_null boolean NOT NULL,
    __count bigint NOT NULL,
    m2_n bigint NOT NULL,
    m3_n bigint NOT NULL,
    m3_sum numeric NOT NULL,
    m4_n bigint NOT NULL,
    m4_sum numeric NOT NULL,
    m5_val numeric,
    m6_val numeric,
    m7_val bigint NOT NULL,
    __dirty boolean NOT NULL DEFAULT false
) WITH (fillfactor = 70);

ALTER TABLE eventview._v3_data ADD COLUMN IF NOT EXISTS m5_vals numeric[], ADD COLUMN IF NOT EXISTS m6_vals numeric[];

CREATE UNIQUE INDEX _v3_data_key ON eventview._v3_data (__k, bucket, g1, g1_null, g2, g2_null);

CREATE INDEX _v3_data_dirty ON eventview._v3_data (__k) WHERE __dirty;

CREATE INDEX _v3_data_read ON eventview._v3_data ((CASE WHEN g1_null THEN NULL ELSE g1 END), (CASE WHEN g2_null THEN NULL ELSE g2 END), bucket);

CREATE TABLE eventview._v3_m5 (
    __k boolean NOT NULL DEFAULT true,
    bucket timestamptz NOT NULL,
    g1 text NOT NULL,
    g1_null boolean NOT NULL,
    g2 text NOT NULL,
    g2_null boolean NOT NULL,
    v numeric NOT NULL,
    n bigint NOT NULL
) WITH (fillfactor = 70);

CREATE UNIQUE INDEX _v3_m5_key ON eventview._v3_m5 (__k, bucket, g1, g1_null, g2, g2_null, v);

CREATE TABLE eventview._v3_m5_log (LIKE eventview._v3_m5 INCLUDING DEFAULTS);

CREATE TABLE eventview._v3_m6 (
    __k boolean NOT NULL DEFAULT true,
    bucket timestamptz NOT NULL,
    g1 text NOT NULL,
    g1_null boolean NOT NULL,
    g2 text NOT NULL,
    g2_null boolean NOT NULL,
    v numeric NOT NULL,
    n bigint NOT NULL
) WITH (fillfactor = 70);

CREATE UNIQUE INDEX _v3_m6_key ON eventview._v3_m6 (__k, bucket, g1, g1_null, g2, g2_null, v);

CREATE TABLE eventview._v3_m6_log (LIKE eventview._v3_m6 INCLUDING DEFAULTS);

CREATE TABLE eventview._v3_m7 (
    __k boolean NOT NULL DEFAULT true,
    bucket timestamptz NOT NULL,
    g1 text NOT NULL,
    g1_null boolean NOT NULL,
    g2 text NOT NULL,
    g2_null boolean NOT NULL,
    v jsonb NOT NULL,
    n bigint NOT NULL,
    prev_n bigint NOT NULL DEFAULT 0
) WITH (fillfactor = 70);

CREATE UNIQUE INDEX _v3_m7_key ON eventview._v3_m7 (__k, bucket, g1, g1_null, g2, g2_null, v);

CREATE TABLE "shop"."cart_events" (
    event_id      bigint GENERATED ALWAYS AS IDENTITY,
    event_key     text,
    event_type    text NOT NULL CHECK (event_type <> ''),
    event_version integer NOT NULL DEFAULT 1 CHECK (event_version >= 1),
    producer      text NOT NULL DEFAULT current_user,
    occurred_at   timestamptz NOT NULL DEFAULT now(),
    ingested_at   timestamptz NOT NULL DEFAULT now(),
    payload       jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
    PRIMARY KEY (event_id, occurred_at)
) PARTITION BY RANGE (occurred_at);

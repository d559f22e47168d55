CREATE TABLE "shop"."cart_events" (
    event_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_key     text UNIQUE,
    event_type    text NOT NULL CHECK (event_type <> ''),
    event_version integer NOT NULL DEFAULT 1 CHECK (event_version >= 1),
    producer      text NOT NULL DEFAULT current_user,
    occurred_at   timestamptz NOT NULL DEFAULT now(),
    ingested_at   timestamptz NOT NULL DEFAULT now(),
    payload       jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object')
);

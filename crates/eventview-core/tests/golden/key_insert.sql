INSERT INTO eventview._keys_2 (event_key, occurred_at) SELECT u.k, u.at FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.timestamptz[])) AS u(k, at);

WITH taken AS (
    UPDATE eventview._keys_2 t SET claimed_by = NULL, occurred_at = f.at
    FROM (SELECT DISTINCT ON (u.k) u.k, u.at FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.timestamptz[])) AS u(k, at)) f
    WHERE t.event_key OPERATOR(pg_catalog.=) f.k
      AND t.claimed_by OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id()
    RETURNING t.event_key
)
INSERT INTO eventview._keys_2 (event_key, occurred_at)
SELECT n.k, n.at
FROM (SELECT u.k, u.at, pg_catalog.row_number() OVER (PARTITION BY u.k) AS nth FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.timestamptz[])) AS u(k, at)) n
WHERE NOT (n.nth OPERATOR(pg_catalog.=) 1
           AND EXISTS (SELECT 1 FROM taken WHERE taken.event_key OPERATOR(pg_catalog.=) n.k));

INSERT INTO eventview._keys_2 (event_key) SELECT u.k FROM pg_catalog.unnest($1::pg_catalog.text[]) AS u(k);

WITH taken AS (
    UPDATE eventview._keys_2 t SET claimed_by = NULL
    WHERE t.claimed_by OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id()
      AND t.event_key OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])
    RETURNING t.event_key
)
INSERT INTO eventview._keys_2 (event_key)
SELECT n.k
FROM (SELECT u.k, pg_catalog.row_number() OVER (PARTITION BY u.k) AS nth
      FROM pg_catalog.unnest($1::pg_catalog.text[]) AS u(k)) n
WHERE NOT (n.nth OPERATOR(pg_catalog.=) 1
           AND EXISTS (SELECT 1 FROM taken WHERE taken.event_key OPERATOR(pg_catalog.=) n.k));

\set VERBOSITY terse
-- Runs first: the extension, and a helper that shows SQLSTATE and message of a failing call.
CREATE EXTENSION pg_eventview;
CREATE FUNCTION try(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
SELECT extname, extversion FROM pg_extension WHERE extname = 'pg_eventview';

-- pm_vector: API key changes are announced (migration 0012).
--
-- Every change of pm_vector_service.api_keys (a revocation by `pm-vector keys revoke`, an UPDATE or
-- DELETE by hand) sends NOTIFY pm_vector_keys when its transaction commits. A service process keeps
-- the keys it has verified in memory only while it LISTENs on that channel, and forgets them all
-- on each notification: a revoked key is refused by every service process as soon as the
-- revocation commits, without a key lookup per request.

CREATE OR REPLACE FUNCTION pm_vector_service.pm_keys_changed() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
  PERFORM pg_notify('pm_vector_keys', '');
  RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS pm_keys_changed ON pm_vector_service.api_keys;
CREATE TRIGGER pm_keys_changed AFTER UPDATE OR DELETE OR TRUNCATE ON pm_vector_service.api_keys
  FOR EACH STATEMENT EXECUTE FUNCTION pm_vector_service.pm_keys_changed();

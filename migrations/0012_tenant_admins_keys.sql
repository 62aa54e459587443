-- Issue: keys (items 7 and 12). An admin key is either global (every tenant,
-- every key, /metrics) or bound to its tenant (a tenant admin: that tenant's
-- sessions and keys only). Admin keys made before this were global.
ALTER TABLE api_keys ADD COLUMN global boolean NOT NULL DEFAULT false;
UPDATE api_keys SET global = true WHERE role = 'admin';
ALTER TABLE api_keys ADD CONSTRAINT api_keys_global_admin CHECK (NOT global OR role = 'admin');

-- Every replica drops its cached keys when one is created, revoked or
-- changed, by whatever writer (the API of any replica, `warden keys`, SQL):
-- the payload is the key's public prefix. Last-use updates do not notify.
CREATE FUNCTION warden_keys_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('warden_keys', OLD.prefix);
    ELSE
        PERFORM pg_notify('warden_keys', NEW.prefix);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_changed
    AFTER INSERT OR DELETE OR UPDATE OF prefix, hash, tenant, role, global, revoked_at
    ON api_keys FOR EACH ROW EXECUTE FUNCTION warden_keys_changed();

-- effects.principal: the principal of the call that enqueued the effect,
-- for a forget to find the effects no call leads to (purged calls, calls
-- not recorded); see the SQLite migration 012_effect_principal. Adding a
-- nullable column rewrites no rows; the back-fill updates every effect
-- that has a call, once.
ALTER TABLE effects ADD COLUMN principal TEXT;
UPDATE effects e SET principal = c.principal FROM calls c WHERE c.id = e.call_id;
CREATE INDEX effects_principal_orphan ON effects (principal) WHERE call_id IS NULL;
-- An effect inserted without its principal gets its call's when the call
-- is deleted, before ON DELETE SET NULL cuts the link (see SQLite's 012).
CREATE FUNCTION mcp_outbox_keep_effects_principal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE effects SET principal = OLD.principal WHERE call_id = OLD.id AND principal IS NULL;
    RETURN OLD;
END
$$;
CREATE TRIGGER calls_delete_keeps_effects_principal BEFORE DELETE ON calls
    FOR EACH ROW EXECUTE FUNCTION mcp_outbox_keep_effects_principal();

-- effects.principal: the principal of the call that enqueued the effect,
-- for a forget to find the effects no call leads to (purged calls, calls
-- not recorded); see the SQLite migration 012_effect_principal. Adding a
-- nullable column rewrites no rows; the back-fill updates every effect
-- that has a call, once.
ALTER TABLE effects ADD COLUMN principal TEXT;
UPDATE effects e SET principal = c.principal FROM calls c WHERE c.id = e.call_id;
CREATE INDEX effects_principal_orphan ON effects (principal) WHERE call_id IS NULL;

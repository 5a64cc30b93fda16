-- effects.principal: the principal of the call that enqueued the effect.
-- A forget (admin.ForgetPrincipal) finds an effect through its call, but
-- not every effect has one: the retention purge removes a finished call
-- while its delivered and cancelled effects stay (call_id set NULL), and a
-- call that is not recorded (a tool with recording off, a call with no key
-- to record it under) enqueues its effects with no call at all. Their
-- bodies, plaintext on a database without a key file, stayed after the
-- principal was forgotten. The layer writes it with the effect; one
-- inserted without it (a cooperating upstream's, an older binary's) gets
-- its call's when the call is deleted (the trigger below).
ALTER TABLE effects ADD COLUMN principal TEXT;
UPDATE effects SET principal = (SELECT c.principal FROM calls c WHERE c.id = effects.call_id)
WHERE call_id IS NOT NULL;
-- The forget's look-up of the effects no call leads to; the rest are
-- found through effects_call.
CREATE INDEX effects_principal_orphan ON effects (principal) WHERE call_id IS NULL;
-- An effect inserted without its principal (by a cooperating upstream,
-- whose contract makes the column optional, or by an older binary) gets
-- its call's when the call is deleted, before ON DELETE SET NULL cuts the
-- link a forget finds it by.
CREATE TRIGGER calls_delete_keeps_effects_principal BEFORE DELETE ON calls
BEGIN
    UPDATE effects SET principal = OLD.principal WHERE call_id = OLD.id AND principal IS NULL;
END;

-- effects.principal: the principal of the call that enqueued the effect.
-- A forget (admin.ForgetPrincipal) finds an effect through its call, but
-- not every effect has one: the retention purge removes a finished call
-- while its delivered and cancelled effects stay (call_id set NULL), and a
-- call that is not recorded (a tool with recording off, a call with no key
-- to record it under) enqueues its effects with no call at all. Their
-- bodies, plaintext on a database without a key file, stayed after the
-- principal was forgotten. The layer writes it with the effect; NULL for
-- an effect enqueued by a binary older than this migration after it ran
-- (a rolling upgrade), which a forget finds only while its call lasts.
ALTER TABLE effects ADD COLUMN principal TEXT;
UPDATE effects SET principal = (SELECT c.principal FROM calls c WHERE c.id = effects.call_id)
WHERE call_id IS NOT NULL;
-- The forget's look-up of the effects no call leads to; the rest are
-- found through effects_call.
CREATE INDEX effects_principal_orphan ON effects (principal) WHERE call_id IS NULL;

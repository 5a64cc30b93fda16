-- effects.traceparent: the W3C traceparent of the span of the call that
-- enqueued the effect, '' when the call was not traced; see the SQLite
-- migration 005_effect_traceparent for why it is stored. Adding a column
-- with a constant default rewrites no rows (PostgreSQL 11 and later).
ALTER TABLE effects ADD COLUMN traceparent TEXT NOT NULL DEFAULT '';

-- effects.traceparent: the W3C traceparent of the span of the call that
-- enqueued the effect (00-TRACEID-SPANID-FLAGS), '' when the call was not
-- traced. The dispatcher makes each delivery attempt's span a child of it,
-- and sends that attempt's own traceparent downstream, so a delivery that
-- happens after a restart, or in another replica, still joins the call's
-- trace. Stored rather than kept in memory for exactly that reason.
-- Upstreams that write effects themselves may fill it from the
-- traceparent the proxy puts in the forwarded call's _meta; the default
-- keeps their INSERTs as they are.
ALTER TABLE effects ADD COLUMN traceparent TEXT NOT NULL DEFAULT '';

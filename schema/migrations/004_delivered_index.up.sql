-- effects_delivered: deliveries by time, for the operator page's chart of
-- the last hour or day. Without it the chart's query reads every delivered
-- effect the retention keeps (about 200 ms per million on the 2-core VM);
-- partial, so that pending and failing effects, which change state most,
-- do not maintain it.
CREATE INDEX effects_delivered ON effects (delivered_at) WHERE state = 'delivered';

package operate_test

import (
	"log"
	"os"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/query"
)

// Effects as `mcp-outbox outbox list` prints them; the rows come from
// opsquery.ListEffects. Text from a destination is printed on one line,
// without control characters.
func ExampleWriteEffectTable() {
	t := time.Date(2026, 7, 28, 9, 30, 0, 0, time.UTC)
	next := t.Add(time.Minute)
	rows := []opsquery.EffectRow{
		{ID: 2, CallKey: "order-7", EffectStatus: query.EffectStatus{Destination: "payments", Method: "POST", Path: "/v1/charges",
			State: "pending", Attempts: 1, LastStatus: 503, LastError: "upstream\r\nbusy", NextAttemptAt: &next}, UpdatedAt: t},
		{ID: 1, EffectStatus: query.EffectStatus{Destination: "mailer", Method: "POST", Path: "/send", State: "delivered",
			Attempts: 1, LastStatus: 202, DeliveredAt: &t}, UpdatedAt: t},
	}
	if err := operate.WriteEffectTable(os.Stdout, rows); err != nil {
		log.Fatal(err)
	}
	// Output:
	// ID  STATE      DEST      REQUEST           ATTEMPTS  STATUS  WHEN (UTC)                     CALL KEY  LAST ERROR
	// 2   pending    payments  POST /v1/charges  1         503     next 2026-07-28 09:31:00       order-7   upstream  busy
	// 1   delivered  mailer    POST /send        1         202     delivered 2026-07-28 09:30:00  -         -
}

// Calls in state unknown as `mcp-outbox outbox calls` prints them; the
// rows come from opsquery.ListUnknownCalls.
func ExampleWriteUnknownCallTable() {
	rows := []opsquery.UnknownCall{{Principal: "user:alice", Key: "order-7", Tool: "charge", CallID: "c-1f2e",
		Attempts: 1, CreatedAt: time.Date(2026, 7, 28, 9, 30, 0, 0, time.UTC)}}
	if err := operate.WriteUnknownCallTable(os.Stdout, rows); err != nil {
		log.Fatal(err)
	}
	// Output:
	// PRINCIPAL   KEY      TOOL    ATTEMPTS  CREATED (UTC)        CALL ID
	// user:alice  order-7  charge  1         2026-07-28 09:30:00  c-1f2e
}

package operate

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
)

// Tables for a terminal: what the command line prints of the reads the API
// and the page share. Text that came from a destination or a client
// (errors, paths, keys) goes through [Shorten], which blanks control
// characters, so that it cannot move the cursor or recolour the operator's
// terminal. Times are in UTC.

// WriteEffectTable prints effects, a row each: id, state, destination,
// request, attempts, last HTTP status, when (the next attempt for pending,
// the delivery for delivered, the last change otherwise), the call's key
// and the last error, the long ones shortened.
func WriteEffectTable(w io.Writer, rows []opsquery.EffectRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tDEST\tREQUEST\tATTEMPTS\tSTATUS\tWHEN (UTC)\tCALL KEY\tLAST ERROR")
	for _, r := range rows {
		status := "-"
		if r.LastStatus != 0 {
			status = strconv.Itoa(r.LastStatus)
		}
		var when string
		switch {
		// An unknown effect's next_attempt_at is only when a probe may ask
		// about it; without a probe nothing happens then, so it shows
		// since when it is unknown instead.
		case r.State == "pending" && r.NextAttemptAt != nil:
			when = "next " + tableTime(*r.NextAttemptAt)
		case r.DeliveredAt != nil:
			when = "delivered " + tableTime(*r.DeliveredAt)
		default:
			when = "since " + tableTime(r.UpdatedAt)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n",
			r.ID, r.State, Shorten(r.Destination, 20), Shorten(r.Method+" "+r.Path, 40), r.Attempts, status,
			when, orDash(Shorten(r.CallKey, 20)), orDash(Shorten(r.LastError, 60)))
	}
	return tw.Flush()
}

// WriteUnknownCallTable prints calls in state unknown, a row each:
// principal, key, tool, claims made, when the call was first made and its
// call id. Keys are shown whole (at most 255 bytes), for resolving the
// call by its key; Shorten only blanks control characters, which a valid
// key has none of.
func WriteUnknownCallTable(w io.Writer, rows []opsquery.UnknownCall) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tKEY\tTOOL\tATTEMPTS\tCREATED (UTC)\tCALL ID")
	for _, c := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", Shorten(c.Principal, 60), Shorten(c.Key, callkey.MaxKeyBytes),
			Shorten(c.Tool, 40), c.Attempts, tableTime(c.CreatedAt), c.CallID)
	}
	return tw.Flush()
}

func tableTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

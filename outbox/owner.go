package outbox

import (
	"strings"

	"github.com/mcp-outbox/mcp-outbox/outbox/internal/owner"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// processID names one layer in one process: see owner.Process.
type processID = owner.Process

func currentProcess() processID { return owner.Current() }

type liveness = owner.Liveness

const (
	ownerUnknown = owner.Unknown
	ownerDead    = owner.Dead
	ownerSelf    = owner.Self
)

// liveness is what the layer can know of owner. On SQLite every owner runs
// on this machine, so /proc tells a dead one. On PostgreSQL an owner may run
// on another machine, where /proc says nothing, and the same host name and
// pid may name another container's process: only this layer's own
// attempts are known, and every other owner is trusted until its lease
// passes. Live owners renew their leases (see renew.go).
func (l *Layer) liveness(owner string) liveness {
	if l.db.Dialect == schema.Postgres {
		if proc, _, _ := strings.Cut(owner, "#"); proc == string(l.self) {
			return ownerSelf
		}
		return ownerUnknown
	}
	return l.self.Of(owner)
}

package sealing

import (
	"context"
	"fmt"
	"time"
)

const eraseDEKs = `
UPDATE data_keys SET wrapped = NULL, erased_at = $2 WHERE principal = $1 AND purpose = 'seal' AND erased_at IS NULL`

// Forget erases principal's data keys in q: every value sealed under them
// can no longer be opened, by this process or any other, from this
// database or any later copy of it. It needs no key ring. It returns how
// many data keys it erased (0: nothing of the principal was sealed).
func Forget(ctx context.Context, q Querier, principal string, now time.Time) (int64, error) {
	r, err := q.ExecContext(ctx, eraseDEKs, principal, now.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("erase data keys: %w", err)
	}
	return r.RowsAffected()
}

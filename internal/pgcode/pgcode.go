// Package pgcode reads the SQLSTATE of a PostgreSQL error without linking
// a client library, for the core and the stores, which tell a few codes
// apart (a unique violation, a serialization failure, a lock not
// available).
package pgcode

import "errors"

// PostgreSQL error codes (SQLSTATE) that the layer tells apart.
const (
	UniqueViolation      = "23505"
	SerializationFailure = "40001"
	DeadlockDetected     = "40P01"
	LockNotAvailable     = "55P03"
	QueryCanceled        = "57014"
)

// Of is the SQLSTATE of a PostgreSQL error, or "" for any other error.
// It asks the error, not a client library's type (pgx's *pgconn.PgError
// and lib/pq's *Error both answer SQLState), so the core reads codes
// without linking a client.
func Of(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

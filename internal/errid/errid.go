// Package errid names a server error for the two people who meet it: the
// one answered, who gets the id and the layer's words, and the operator,
// whose log has the id with the full error (a driver's text, a host
// name), which no answer repeats.
package errid

import (
	"crypto/rand"
	"encoding/hex"
)

// New returns 8 random hex digits: enough to find one line in a day's
// log, short enough to read out.
func New() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b[:])
}

package scenario

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"
)

// nodeAttempts is LangGraph's default RetryPolicy.max_attempts.
const nodeAttempts = 3

// RetryPolicy models an agent framework's node retry (LangGraph's
// RetryPolicy): on an error it retries, the node is run again from its start,
// with everything in it, including tool calls that had already completed.
type RetryPolicy struct {
	// MaxAttempts counts the first run.
	MaxAttempts int
	// InitialInterval is the wait before the first retry; each further
	// wait is BackoffFactor times longer.
	InitialInterval time.Duration
	BackoffFactor   float64
	// RetryOn says which errors are retried.
	RetryOn func(error) bool
}

// defaultRetryPolicy is LangGraph's default shape (3 attempts, backoff 2,
// retry on connection errors), with a shorter first interval than its 0.5s
// to keep the demo quick; the interval does not change what happens.
func defaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: nodeAttempts, InitialInterval: 20 * time.Millisecond, BackoffFactor: 2, RetryOn: isConnectionError}
}

// Run runs node until it succeeds, fails with an error RetryOn rejects, or
// has run MaxAttempts times. node gets the attempt number, from 1.
func (p RetryPolicy) Run(ctx context.Context, node func(ctx context.Context, attempt int) error) error {
	interval := p.InitialInterval
	for attempt := 1; ; attempt++ {
		err := node(ctx, attempt)
		if err == nil || attempt >= p.MaxAttempts || !p.RetryOn(err) {
			return err
		}
		t := time.NewTimer(interval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		}
		interval = time.Duration(float64(interval) * p.BackoffFactor)
	}
}

// isConnectionError is the Go counterpart of Python's ConnectionError, the
// error class LangGraph's default retry_on retries.
func isConnectionError(err error) bool {
	if err == nil {
		return false
	}
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE)
}

// errDownstream is the error of the node's step after the charge.
func errDownstream() error {
	return &net.OpError{Op: "read", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8443}, Err: syscall.ECONNRESET}
}

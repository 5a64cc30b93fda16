package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestRetryPolicyRerunsOnConnectionErrors(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 3, InitialInterval: time.Millisecond, BackoffFactor: 2, RetryOn: isConnectionError}
	for _, tc := range []struct {
		name  string
		fail  func(attempt int) error
		runs  int
		final bool // an error is returned
	}{
		{"succeeds at once", func(int) error { return nil }, 1, false},
		{"connection error twice", func(n int) error {
			if n < 3 {
				return errDownstream()
			}
			return nil
		}, 3, false},
		{"connection error always", func(int) error { return fmt.Errorf("post receipt: %w", errDownstream()) }, 3, true},
		{"other error is not retried", func(int) error { return errors.New("bad amount") }, 1, true},
		{"timeout is not retried", func(int) error { return context.DeadlineExceeded }, 1, true},
	} {
		runs := 0
		err := p.Run(context.Background(), func(_ context.Context, attempt int) error {
			runs++
			if attempt != runs {
				t.Errorf("%s: attempt %d on run %d", tc.name, attempt, runs)
			}
			return tc.fail(attempt)
		})
		if runs != tc.runs || (err != nil) != tc.final {
			t.Errorf("%s: %d runs, error %v; want %d runs, error %v", tc.name, runs, err, tc.runs, tc.final)
		}
	}
}

func TestRetryPolicyStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := RetryPolicy{MaxAttempts: 3, InitialInterval: time.Hour, BackoffFactor: 2, RetryOn: isConnectionError}
	err := p.Run(ctx, func(context.Context, int) error { cancel(); return errDownstream() })
	if !errors.Is(err, context.Canceled) || !isConnectionError(err) {
		t.Errorf("error %v; want the node's error and the cancellation", err)
	}
}

func TestConnectionClosed(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("calling %q: %w", "tools/call", io.EOF),
		fmt.Errorf("%w: calling %q: client is closing", mcp.ErrConnectionClosed, "tools/call"),
	} {
		if !ConnectionClosed(err) {
			t.Errorf("ConnectionClosed(%v) = false", err)
		}
	}
	if ConnectionClosed(context.DeadlineExceeded) || ConnectionClosed(nil) {
		t.Error("a timeout or no error is not a closed connection")
	}
}

func TestCheckRejectsRunsThatProveNothing(t *testing.T) {
	charged := Attempt{ChargeID: 1, What: "charge #1"}
	timedOut := Attempt{Err: context.DeadlineExceeded, What: "client timed out"}
	closed := Attempt{Err: io.EOF, What: "connection closed"}
	nodeFailed := Attempt{ChargeID: 1, NodeErr: errDownstream(), What: "charge #1, then the node failed"}
	for _, tc := range []struct {
		id       ID
		attempts []Attempt
		wantErr  string // "" for a valid run
	}{
		{Timeout, []Attempt{timedOut, charged}, ""},
		{Timeout, []Attempt{charged, charged}, "did not time out"},
		{HTTPStateless, []Attempt{timedOut, timedOut}, "did not end with a charge"},
		{Crash, []Attempt{closed, charged}, ""},
		{Crash, []Attempt{timedOut, charged}, "closed connection"},
		{FrameworkRetry, []Attempt{nodeFailed, nodeFailed, charged}, ""},
		{FrameworkRetry, []Attempt{nodeFailed, charged}, "ran 2 times"},
		{FrameworkRetry, []Attempt{charged, nodeFailed, charged}, "attempt 1"},
		{Timeout, nil, "no attempt"},
	} {
		err := Result{Scenario: tc.id, Mode: Bare, Attempts: tc.attempts}.Check()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s %v: %v", tc.id, tc.attempts, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s %v: error %v, want one containing %q", tc.id, tc.attempts, err, tc.wantErr)
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, tc := range []struct {
		cfg  Config
		id   ID
		mode Mode
		want string
	}{
		{Config{Dir: dir}, Timeout, Bare, "no server binary"},
		{Config{Binary: "x"}, Timeout, Bare, "no directory"},
		{Config{Binary: "x", Dir: dir, Delay: time.Second, Timeout: time.Second}, Timeout, Bare, "must be shorter"},
		{Config{Binary: "x", Dir: dir}, "nope", Bare, "unknown scenario"},
		{Config{Binary: "x", Dir: dir}, Timeout, "nope", "unknown mode"},
	} {
		if _, err := Run(ctx, tc.cfg, tc.id, tc.mode); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run(%+v, %s, %s): %v, want an error containing %q", tc.cfg, tc.id, tc.mode, err, tc.want)
		}
	}
}

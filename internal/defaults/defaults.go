// Package defaults holds the values the layer gives a setting left at
// zero, so that the layer and the mcp-outbox command (its flags' defaults
// and --help) share one number. Each setting's doc in package outbox says
// its default in words.
package defaults

import "time"

// Defaults for outbox.Options fields left at their zero value.
const (
	// FingerprintWindow is how long a call without a key is remembered
	// by its fingerprint. Within it, a second call with the same tool and
	// arguments from the same principal is taken as a retry and replayed, so a
	// window much longer than clients' retry horizons would merge genuinely
	// separate calls. Clients that send keys are not affected.
	FingerprintWindow = 5 * time.Minute
	// KeyRetention is how long a call with an explicit key is
	// remembered (Stripe keeps keys at least 24 hours).
	KeyRetention = 24 * time.Hour
	// InFlightWait bounds how long a duplicate waits for the original
	// attempt's outcome, and how long a claim keeps trying while another
	// process holds SQLite's write lock, before it gets an "in progress"
	// error.
	InFlightWait = 30 * time.Second
	// Lease is how long an in_flight claim protects a call whose owner
	// cannot be checked for liveness (another machine, another layer in the
	// same process). Handlers that run longer than the lease before their
	// first statement can lose the call to another attempt; they then fail
	// the fence and commit nothing.
	Lease = time.Minute
)

// Defaults for the group commit knobs of outbox.Options.
const (
	// MaxBatchCalls bounds the calls that share one commit.
	MaxBatchCalls = 64
	// MaxBatchWait bounds how long a batch stays open taking more
	// units once it has begun, which bounds what its first call waits.
	MaxBatchWait = 10 * time.Millisecond
)

const (
	// CallRetention matches KeyRetention, so that by default a
	// call row lives exactly as long as its key is remembered; calls known by
	// a short fingerprint window stay this long for operators, whose effect
	// listings name the call's key and tool.
	CallRetention = 24 * time.Hour
	// DeliveredRetention keeps delivered effects, with the response
	// the destination sent, long enough to answer "did it go out?" for a
	// week after the fact.
	DeliveredRetention = 7 * 24 * time.Hour
	// CancelledRetention gives an operator a week to change their
	// mind: a cancelled effect can be retried until it is purged.
	CancelledRetention = 7 * 24 * time.Hour
	// ReapInterval is how often the reaper purges by default.
	ReapInterval = 10 * time.Minute
)

// Defaults for outbox.TaskOptions fields left at zero.
const (
	// TaskAfter is how long a TasksIfSlow call may take and still
	// get a plain answer.
	TaskAfter = time.Second
	// TaskPollInterval is the pollIntervalMs told to clients.
	TaskPollInterval = 500 * time.Millisecond
	// MinTaskTTL is the shortest ttl a client's request gets (2025-11-25
	// params.task.ttl): a task kept for less could be gone before its
	// client read its result.
	MinTaskTTL = time.Minute
)

// TaskScanInterval is how often a started layer looks for tasks
// whose owner is gone, beside the scan at Start.
const TaskScanInterval = 10 * time.Second

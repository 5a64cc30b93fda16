// Package failpoint lets crash tests stop the process at a named point.
//
// A build with the tag "failpoints" reads MCP_OUTBOX_FAILPOINTS at start-up:
// a list of name=action separated by ';', where action is one of
//
//	crash        SIGKILL this process (no deferred code runs, nothing is flushed)
//	error        Inject returns an error, as if the step had failed
//	sleep(DUR)   sleep for a time.ParseDuration duration, then go on
//	panic        panic
//
// An action followed by @N (crash@3) acts on the N-th time the point is
// reached only; before and after that the point does nothing.
//
// for example MCP_OUTBOX_FAILPOINTS='call.after_commit=crash'. Without the tag
// Inject is an empty function that the compiler removes, so production builds
// carry none of this.
//
// Names on the call path (package outbox):
//
//	call.after_claim    the key is claimed (in_flight committed), handler not run
//	call.before_commit  the handler ran; its transaction is not committed
//	call.after_commit   the outcome is committed; the response is not written
//
// In group commit (package outbox), only for batches of two or more calls:
//
//	batch.before_commit  the batch's calls are in its transaction, not committed
//	batch.after_commit   the batch is committed; none of its calls has answered
//
// On the proxy's path (package internal/proxy):
//
//	proxy.after_forward  the tools/call was written to the upstream; its answer not read
package failpoint

// Names of the failpoints on the call path.
const (
	CallAfterClaim   = "call.after_claim"
	CallBeforeCommit = "call.before_commit"
	CallAfterCommit  = "call.after_commit"
)

// Names of the failpoints of group commit.
const (
	BatchBeforeCommit = "batch.before_commit"
	BatchAfterCommit  = "batch.after_commit"
)

// ProxyAfterForward is the failpoint between forwarding a call to the
// upstream and reading its answer.
const ProxyAfterForward = "proxy.after_forward"

// EnvVar is the environment variable a failpoints build reads.
const EnvVar = "MCP_OUTBOX_FAILPOINTS"

package outbox

import "context"

// SetTestHookAfterCommit lets tests act between a call's commit and its response.
func SetTestHookAfterCommit(f func(context.Context)) { testHookAfterCommit = f }

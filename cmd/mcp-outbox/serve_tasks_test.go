package main

import (
	"testing"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

func TestServe_TaskFlag(t *testing.T) {
	t.Parallel()
	got, err := parseTasks([]string{"charge=after:500ms", "refund=always"})
	if err != nil {
		t.Fatal(err)
	}
	if got["charge"].Mode != outbox.TasksIfSlow || got["charge"].After != 500*time.Millisecond || got["refund"].Mode != outbox.TasksAlways {
		t.Errorf("parseTasks = %+v", got)
	}
	if got, err := parseTasks([]string{"charge=required,refund=always"}); err != nil || got["charge"].Mode != outbox.TasksRequired {
		t.Errorf("comma list: %+v %v", got, err)
	}
	for _, bad := range []string{"charge", "charge=sometimes", "balance=always", "nope=always", "charge=after:-1s", "charge=always,charge=required"} {
		if _, err := parseTasks([]string{bad}); err == nil {
			t.Errorf("parseTasks(%q) accepted", bad)
		}
	}
}

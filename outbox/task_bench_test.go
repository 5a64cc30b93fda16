package outbox_test

import (
	"fmt"
	"testing"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// BenchmarkTask compares, over stdio (mcpstdio, 2026-07-28 requests), the
// answer to a charge with a new key: a plain call (the request does not
// declare the extension, so the handler runs and commits before the
// answer), and a task (TasksAlways: the answer waits for the task's
// durable claim only; the handler runs and commits after it). And the
// tasks/get poll a client repeats while a task works.
func BenchmarkTask(b *testing.B) {
	b.Run("plain-call", func(b *testing.B) {
		bd := taskSetup(b, openDB(b), outbox.TasksAlways, nil)
		p := stdioPeer(b, bd.server)
		for i := 0; b.Loop(); i++ {
			if r := result(b, p.charge(false, fmt.Sprint("plain-", i), 100)); r["isError"] == true {
				b.Fatal(r)
			}
		}
	})
	b.Run("create-task", func(b *testing.B) {
		bd := taskSetup(b, openDB(b), outbox.TasksAlways, nil)
		p := stdioPeer(b, bd.server)
		for i := 0; b.Loop(); i++ {
			if r := result(b, p.charge(true, fmt.Sprint("task-", i), 100)); r["resultType"] != "task" {
				b.Fatal(r)
			}
		}
		b.StopTimer()
		outbox.WaitTasks(bd.layer)
	})
	b.Run("tasks-get", func(b *testing.B) {
		bd := taskSetup(b, openDB(b), outbox.TasksAlways, nil)
		p := stdioPeer(b, bd.server)
		id := result(b, p.charge(true, "polled", 100))["taskId"].(string)
		outbox.WaitTasks(bd.layer)
		for b.Loop() {
			if r := result(b, p.task("tasks/get", id)); r["status"] != "completed" {
				b.Fatal(r)
			}
		}
	})
}

package main

import (
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// tasksHelp is the Tasks paragraph of serve's --help.
const tasksHelp = `Tasks (MCP 2026-07-28, extension io.modelcontextprotocol/tasks; and the
experimental Tasks of 2025-11-25, on a session made with initialize):
  --task TOOL=MODE makes calls of TOOL tasks, repeatable; MODE is
    always          a task whenever the request asks for one
    required        only as a task: a request that does not ask gets error
                    -32021 (2026-07-28) or -32601 (2025-11-25)
    after:DURATION  a plain answer if the call finishes within DURATION,
                    else a task (e.g. --task charge=after:500ms); at
                    2025-11-25 the client decides, and gets a task at once
  [MCP_OUTBOX_TASKS=charge=after:500ms,refund=always]. A request asks for a
  task by declaring the extension in its _meta (2026-07-28), or by sending
  params.task to a tool that tools/list shows with execution.taskSupport
  optional or required (2025-11-25); one that does not ask never gets a
  task. A task is committed (with an fsync) before its handle is sent; a
  retry of the same call (same key, or same tool and arguments without
  one) gets the same task, never a second one; a task whose process died
  is run again by the next serve on the database (or another replica on
  PostgreSQL), once: nothing of an uncommitted attempt was kept. tasks/get,
  tasks/update and tasks/cancel (2026-07-28), and tasks/get, tasks/result,
  tasks/list and tasks/cancel (2025-11-25), answer from any serve on the
  database, for the principal whose task it is. A task is kept (ttl) as
  long as the key that finds it again; a 2025-11-25 client may ask for less
  in params.task.ttl, and gets at least a minute. Status notifications: a
  2025-11-25 session that asked for a task gets notifications/tasks/status
  when it ends here (on stdio, and over HTTP on the session's GET stream);
  a 2026-07-28 client gets notifications/tasks, from any serve on the
  database, on a subscriptions/listen it opens with {"taskIds": [...]}.
  --task-poll sets the pollIntervalMs clients are told. balance is
  read-only and is never a task. Given, --task replaces MCP_OUTBOX_TASKS.
`

// parseTasks turns --task values into the ledger's task options.
func parseTasks(values []string) (map[string]outbox.TaskOptions, error) {
	return parseTaskFlags(values, func(item, tool string) error {
		switch tool {
		case "charge", "refund":
			return nil
		case "balance":
			return usagef("--task %q: balance is read-only, so it is never recorded and cannot be a task", item)
		}
		return usagef("--task %q: no tool %q (charge or refund)", item, tool)
	})
}

// parseTaskFlags turns --task values into task options by tool; check
// refuses a tool the command cannot make tasks of.
func parseTaskFlags(values []string, check func(item, tool string) error) (map[string]outbox.TaskOptions, error) {
	out := map[string]outbox.TaskOptions{}
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			tool, mode, ok := strings.Cut(item, "=")
			if !ok || tool == "" {
				return nil, usagef("--task %q: want TOOL=always|required|after:DURATION", item)
			}
			if err := check(item, tool); err != nil {
				return nil, err
			}
			var o outbox.TaskOptions
			switch {
			case mode == "always":
				o.Mode = outbox.TasksAlways
			case mode == "required":
				o.Mode = outbox.TasksRequired
			case strings.HasPrefix(mode, "after:"):
				d, err := time.ParseDuration(strings.TrimPrefix(mode, "after:"))
				if err != nil || d <= 0 {
					return nil, usagef("--task %q: after: wants a positive duration such as 500ms", item)
				}
				o.Mode, o.After = outbox.TasksIfSlow, d
			default:
				return nil, usagef("--task %q: mode %q is not always, required or after:DURATION", item, mode)
			}
			if _, dup := out[tool]; dup {
				return nil, usagef("--task: %s given twice", tool)
			}
			out[tool] = o
		}
	}
	return out, nil
}

// taskFlagDefault is MCP_OUTBOX_TASKS, as --task values.
func taskFlagDefault(env *environment) []string {
	if v := env.envDefault("MCP_OUTBOX_TASKS", ""); v != "" {
		return []string{v}
	}
	return nil
}

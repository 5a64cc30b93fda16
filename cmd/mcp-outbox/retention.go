package main

import (
	"flag"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/outbox"
)

// retentionHelp is the per-tool retention paragraph of serve's and proxy's
// --help.
const retentionHelp = `Retention per tool (as Restate sets it per handler; Stripe keeps idempotent
responses 24h):
  --retention TOOL=DURATION gives TOOL's calls their own retention instead of
  --calls-ttl, repeatable; the value is one of
    DURATION          both of the below (e.g. --retention charge=1h)
    key:DURATION      how long a client's idempotency key replays a call of
                      TOOL; after it, a retry with the key runs the call
                      again. call_status shows the end as expiresAt.
    outcome:DURATION  the least time a finished call's record stays in the
                      database; not shorter than the key's time
  Give key: and outcome: as two items for different times
  (--retention charge=key:1h,charge=outcome:24h)
  [MCP_OUTBOX_RETENTION=charge=1h,refund=key:48h]; a flag replaces the
  variable. A call made without a key lasts --fingerprint-window as before.
  Each call keeps the retention its tool had when it was made.
`

// retentionFlag adds --retention to fs; values gets what it is given.
func retentionFlag(fs *flag.FlagSet, values *[]string) {
	fs.Var((*multiFlag)(values), "retention",
		"a tool's own retention: `TOOL=DURATION|key:DURATION|outcome:DURATION`, repeatable; see Retention per tool above [MCP_OUTBOX_RETENTION]")
}

// parseRetention turns --retention values (MCP_OUTBOX_RETENTION when none
// is given) into retention by tool; check refuses a tool the command
// cannot record, keyDefault is --calls-ttl (Options.KeyRetention).
// It refuses what outbox.AddTool would, in the flag's own terms.
func parseRetention(env *environment, values []string, keyDefault time.Duration, check func(item, tool string) error) (map[string]outbox.ToolRetention, error) {
	name := "--retention" // what the errors name
	if len(values) == 0 { // a flag wins over the environment
		if v := env.envDefault("MCP_OUTBOX_RETENTION", ""); v != "" {
			values, name = []string{v}, "MCP_OUTBOX_RETENTION"
		}
	}
	out := map[string]outbox.ToolRetention{}
	// given: which parts each tool was given, to refuse a part twice
	given := map[string]map[string]bool{}
	for _, v := range values {
		for _, item := range strings.Split(v, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			tool, value, ok := strings.Cut(item, "=")
			if !ok || tool == "" || value == "" {
				return nil, usagef("%s %q: want TOOL=DURATION, TOOL=key:DURATION or TOOL=outcome:DURATION", name, item)
			}
			if err := check(item, tool); err != nil {
				return nil, err
			}
			parts := []string{"key", "outcome"}
			if p, d, ok := strings.Cut(value, ":"); ok {
				if p != "key" && p != "outcome" {
					return nil, usagef("%s %q: %q is not key: or outcome:", name, item, p+":")
				}
				parts, value = []string{p}, d
			}
			d, err := time.ParseDuration(value)
			if err != nil || d <= 0 {
				return nil, usagef("%s %q: %q is not a positive duration such as 90m or 24h", name, item, value)
			}
			if given[tool] == nil {
				given[tool] = map[string]bool{}
			}
			r := out[tool]
			for _, p := range parts {
				if given[tool][p] {
					return nil, usagef("%s: the %s time of %s given twice", name, p, tool)
				}
				given[tool][p] = true
				if p == "key" {
					r.Key = d
				} else {
					r.Outcome = d
				}
			}
			out[tool] = r
		}
	}
	for tool, r := range out {
		key, from := r.Key, "key:"
		if key == 0 {
			key, from = keyDefault, "--calls-ttl"
		}
		if r.Outcome > 0 && r.Outcome < key {
			return nil, usagef("%s: %s's outcome:%s is shorter than its key's time %s (%s), "+
				"and a record is kept while its key replays it; give %s=key:%s too, or %s=%s for both",
				name, tool, r.Outcome, key, from, tool, r.Outcome, tool, r.Outcome)
		}
	}
	return out, nil
}

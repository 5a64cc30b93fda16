package main

import (
	"flag"
	"fmt"
	"sort"
	"strings"
)

// bareIgnored are the flags of serve that mean nothing without the outbox
// layer (--bare), with their environment variables: each configures the
// layer, its dispatcher, its reaper or its tasks. A user who gave one
// would believe it applies, so --bare refuses them.
var bareIgnored = map[string]string{
	"dest":                "MCP_OUTBOX_DEST_<NAME>",
	"task":                "MCP_OUTBOX_TASKS",
	"task-poll":           "",
	"retention":           "MCP_OUTBOX_RETENTION",
	"fingerprint-window":  "MCP_OUTBOX_FINGERPRINT_WINDOW",
	"in-flight-wait":      "MCP_OUTBOX_IN_FLIGHT_WAIT",
	"lease":               "MCP_OUTBOX_LEASE",
	"batch-calls":         "MCP_OUTBOX_BATCH_CALLS",
	"batch-wait":          "MCP_OUTBOX_BATCH_WAIT",
	"calls-ttl":           "MCP_OUTBOX_CALLS_TTL",
	"delivered-ttl":       "MCP_OUTBOX_DELIVERED_TTL",
	"log-sensitive":       "",
	"encryption-key-file": "MCP_OUTBOX_ENCRYPTION_KEY_FILE",
}

// checkBare refuses, as a usage error, the flags given on the command line
// that --bare ignores, and warns about the environment variables of such
// flags: the environment may be shared with runs that use the layer, so
// it is not refused.
func checkBare(env *environment, fs *flag.FlagSet) error {
	var given []string
	fs.Visit(func(f *flag.Flag) {
		if _, ok := bareIgnored[f.Name]; ok {
			given = append(given, "--"+f.Name)
		}
	})
	if len(given) > 0 {
		return usagef("--bare runs the ledger without the outbox layer, which %s configure; remove them, or remove --bare",
			strings.Join(given, ", "))
	}
	var set []string
	for _, v := range bareIgnored {
		switch {
		case v == "":
		case strings.HasSuffix(v, "<NAME>"):
			prefix := strings.TrimSuffix(v, "<NAME>")
			for _, kv := range env.environ() {
				if name, val, _ := strings.Cut(kv, "="); strings.HasPrefix(name, prefix) && val != "" {
					set = append(set, name)
				}
			}
		case env.getenv(v) != "":
			set = append(set, v)
		}
	}
	sort.Strings(set)
	for _, v := range set {
		fmt.Fprintf(env.stderr, "mcp-outbox: WARNING: %s is ignored with --bare: it configures the outbox layer, which --bare does not run\n", v)
	}
	return nil
}

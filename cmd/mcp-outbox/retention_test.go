package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRetentionFlag: proxy refuses a --retention that cannot mean anything
// before it opens the database, and both commands document the flag.
func TestRetentionFlag(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "never.db")
	for _, tc := range []struct {
		args []string
		vars map[string]string
		want string
	}{
		{[]string{"--retention", "call_status=1h"}, nil, "call_status is the proxy's own read-only tool"},
		{[]string{"--retention", "charge=key:0s"}, nil, `"0s" is not a positive duration`},
		{[]string{"--retention", "charge=outcome:2h", "--calls-ttl", "3h"}, nil, "shorter than its key's time 3h0m0s (--calls-ttl)"},
		{[]string{"--retention", "charge=key:1h,charge=outcome:30m"}, nil, "shorter than its key's time 1h0m0s (key:)"},
		{nil, map[string]string{"MCP_OUTBOX_RETENTION": "charge"}, `MCP_OUTBOX_RETENTION "charge": want TOOL=DURATION`},
	} {
		out := runCLI(t, tc.vars, append(append([]string{"proxy", "--db", db}, tc.args...), "--", "node", "x.mjs")...)
		if out.code != 2 || !strings.Contains(out.stderr, tc.want) {
			t.Errorf("proxy %v %v: exit %d, stderr %q; want exit 2 saying %q", tc.args, tc.vars, out.code, out.stderr, tc.want)
		}
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("a refused proxy created %s (%v)", db, err)
	}
	for _, cmd := range []string{"serve", "proxy"} {
		help := runCLI(t, nil, cmd, "--help")
		for _, want := range []string{"-retention TOOL=DURATION|key:DURATION|outcome:DURATION", "Retention per tool", "MCP_OUTBOX_RETENTION", "expiresAt"} {
			if !strings.Contains(help.stdout, want) {
				t.Errorf("%s --help does not say %q", cmd, want)
			}
		}
	}
}

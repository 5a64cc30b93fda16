package outbox

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The model's id for a tool call, as a host sends it in params._meta: what
// an operator holding a transcript searches the logs, the spans and the
// status answers for. It is never a key. A model that retries makes a new
// tool call with a new id, so keys, fingerprints and conflicts never see
// it; the calls row keeps the id of the attempt that claimed the call
// (calls.tool_call_id), and each call event and span carries the id of its
// own request, so a replay's shows the retry's id while the row shows the
// one that ran.

// toolCallIDMetaKeys are the params._meta entries hosts put the model's
// tool-call id in, the first found wins. Only entries seen from a real
// host belong here, each with where it was seen.
var toolCallIDMetaKeys = []string{
	// Claude Code 2.1.332 (seen on the wire, December 2026): the model's
	// tool_use id, "toolu_…", on every tools/call.
	"claudecode/toolUseId",
}

// maxToolCallIDBytes bounds a recorded tool-call id. Hosts' ids are short
// (Claude Code's are about 30 bytes); a longer one is cut to its first
// maxToolCallIDBytes, not refused: the id only helps find a call, and a
// host's odd value must never cost the call.
const maxToolCallIDBytes = 200

// toolCallIDOf returns the model's tool-call id of req, cleaned
// (cleanToolCallID), or "" if it carries none. Only a string is an id:
// a number or an object under the key is ignored, since no host sends one
// and any rendering of it would be the layer's invention.
func toolCallIDOf(req *mcp.CallToolRequest) string {
	if req == nil || req.Params == nil {
		return ""
	}
	for _, k := range toolCallIDMetaKeys {
		if s, ok := req.Params.Meta[k].(string); ok {
			if id := cleanToolCallID(s); id != "" {
				return id
			}
		}
	}
	return ""
}

// cleanToolCallID makes s safe to store, log and show: valid UTF-8, no
// control characters (PostgreSQL's text refuses NUL; a line break would
// forge log lines in a text log), no format characters (a bidirectional
// override makes "x\u202egpj.exe" read "xexe.jpg" on the operator's page
// and in a terminal: internal/visible), at most maxToolCallIDBytes bytes,
// cut at a character boundary.
func cleanToolCallID(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			return -1
		}
		return r
	}, s)
	s = strings.TrimSpace(s)
	if len(s) <= maxToolCallIDBytes {
		return s
	}
	cut := maxToolCallIDBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

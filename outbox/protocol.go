package outbox

import (
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// newProtocolVersion is the first protocol version whose results carry
// resultType.
const newProtocolVersion = "2026-07-28"

// usesNewProtocol reports whether req came from a client speaking
// 2026-07-28 or later, which names its version in every request's _meta
// (there is no initialize to remember it from).
func usesNewProtocol(req *mcp.CallToolRequest) bool {
	if req == nil || req.Params == nil {
		return false
	}
	v, _ := req.Params.Meta[mcp.MetaKeyProtocolVersion].(string)
	return v >= newProtocolVersion
}

// forProtocol gives a result the layer answers itself (a replay, a
// conflict, an in-progress or unknown error, the status tool's answer in
// the proxy) the fields that req's protocol version wants on the wire.
//
// For 2026-07-28 that is resultType. The go-sdk sets it in its tools/call
// handler, which an answer of the receiving middleware never reaches, and
// its pass over every result afterwards skips CallToolResult (go-sdk
// v1.8.0, mcp/server.go). The go-sdk client does not mind; the Python SDK
// 2.3.0 refuses such a result ("resultType Field required"), so a client
// on it could never receive a replay. The setter is unexported: the JSON
// form is the way in.
func forProtocol(req *mcp.CallToolRequest, res *mcp.CallToolResult) *mcp.CallToolResult {
	if res == nil || !usesNewProtocol(req) || res.NeedsInput() {
		return res
	}
	b, err := json.Marshal(res)
	if err != nil {
		return res
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return res
	}
	fields["resultType"] = json.RawMessage(`"complete"`)
	if b, err = json.Marshal(fields); err != nil {
		return res
	}
	var out mcp.CallToolResult
	if err := json.Unmarshal(b, &out); err != nil {
		return res
	}
	return &out
}

package mcpstdio

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// lineTransport is the hardened stdio transport NewTransport puts in place
// of an *mcp.StdioTransport or *mcp.IOTransport: newline-delimited JSON-RPC
// on the same streams. The go-sdk's own stdio transport ends the whole
// session at the first line that is not a JSON-RPC message, taking every
// call in flight with it; a client's one bad line should cost one error
// response, as JSON-RPC 2.0 asks. So lineTransport answers such lines itself
// and hands only well-formed messages to the SDK.
type lineTransport struct {
	in     io.Reader
	out    io.Writer
	logger *slog.Logger
	// limit bounds one inbound message, as the wrapped transport's
	// MaxLineLength did (0 there means mcp.DefaultMaxLineLength).
	limit int
	// close runs when the SDK closes the connection: it closes the
	// wrapped transport's streams, as the SDK would have (stdout excepted).
	close func() error
}

// newLineTransport returns the hardened form of t, or nil when t is not a
// stdio transport.
func newLineTransport(t mcp.Transport, logger *slog.Logger) *lineTransport {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	switch t := t.(type) {
	case *mcp.StdioTransport:
		// Like the SDK's: closing the session closes stdin, never stdout.
		return &lineTransport{in: os.Stdin, out: os.Stdout, logger: logger, limit: lineLimit(t.MaxLineLength), close: os.Stdin.Close}
	case *mcp.IOTransport:
		return &lineTransport{in: t.Reader, out: t.Writer, logger: logger, limit: lineLimit(t.MaxLineLength), close: func() error {
			rerr := t.Reader.Close()
			if t.Writer == nil {
				return rerr
			}
			if werr := t.Writer.Close(); rerr == nil {
				return werr
			}
			return rerr
		}}
	}
	return nil
}

// lineLimit reads MaxLineLength as the SDK does: 0 is the default, a
// negative value no cap.
func lineLimit(n int) int {
	switch {
	case n == 0:
		return mcp.DefaultMaxLineLength
	case n < 0:
		return math.MaxInt
	}
	return n
}

func (t *lineTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	out := &lockedWriter{w: t.out, close: t.close}
	pr, pw := io.Pipe()
	// This goroutine outlives the session if t.in never returns from Read,
	// like the SDK's own reader of stdin: there is no portable way to
	// interrupt it.
	go func() { pw.CloseWithError(t.filter(pw, out)) }()
	return (&mcp.IOTransport{Reader: pr, Writer: out, MaxLineLength: -1}).Connect(ctx)
}

// filter copies well-formed lines of t.in to sdk and answers the others on
// out. It returns nil at the end of the input, which the SDK sees as EOF.
func (t *lineTransport) filter(sdk *io.PipeWriter, out *lockedWriter) error {
	br := bufio.NewReaderSize(t.in, 64*1024)
	for {
		line, tooLong, rerr := readLine(br, t.limit)
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 || tooLong {
			reply := checkMessage(trimmed, tooLong, t.limit)
			forward := [][]byte{trimmed}
			if reply == nil && trimmed[0] == '[' {
				forward, reply = out.startBatch(trimmed)
			}
			if reply != nil {
				t.logger.Warn("rejected a malformed JSON-RPC message on stdin", "error", reply.Error.Message)
				if _, err := out.Write(reply.encode()); err != nil {
					return fmt.Errorf("write error response: %w", err)
				}
				forward = nil
			}
			for _, m := range forward {
				if _, err := sdk.Write(append(m, '\n')); err != nil {
					return err // the session is closed
				}
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("read stdin: %w", rerr)
		}
	}
}

// readLine reads up to and including the next newline. A line longer than
// limit is consumed but not returned, and reported as tooLong.
func readLine(br *bufio.Reader, limit int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > limit {
				line, tooLong = nil, true
			} else {
				line = append(line, chunk...)
			}
		}
		if err != bufio.ErrBufferFull {
			return line, tooLong, err
		}
	}
}

// errorReply is a JSON-RPC error response to a message the SDK never sees.
type errorReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func (r *errorReply) encode() []byte {
	b, _ := json.Marshal(r) // only strings, numbers and valid raw JSON
	return append(b, '\n')
}

// checkMessage returns the error response for a line that is not a
// JSON-RPC message (or a non-empty batch of them), or nil for a good one.
// A line that was tooLong is longer than limit.
func checkMessage(line []byte, tooLong bool, limit int) *errorReply {
	r := &errorReply{JSONRPC: "2.0", ID: json.RawMessage("null")}
	switch {
	case tooLong:
		r.Error.Code = jsonrpc.CodeInvalidRequest
		r.Error.Message = fmt.Sprintf("Invalid Request: message longer than %d bytes", limit)
		return r
	case !json.Valid(line):
		r.Error.Code = jsonrpc.CodeParseError
		r.Error.Message = "Parse error: the line is not valid JSON"
		if id, tooDeep := idBeforeOverflow(line); tooDeep {
			r.Error.Message = fmt.Sprintf("Parse error: JSON nested deeper than %d levels", jsonMaxDepth)
			if id != nil {
				r.ID = id
			}
		}
		return r
	}
	msgs := []json.RawMessage{line}
	if line[0] == '[' {
		// Into a fresh slice: unmarshalling into msgs would reuse its
		// element, which shares line's memory, and overwrite the line.
		var batch []json.RawMessage
		if json.Unmarshal(line, &batch) != nil || len(batch) == 0 {
			r.Error.Code = jsonrpc.CodeInvalidRequest
			r.Error.Message = "Invalid Request: empty batch"
			return r
		}
		msgs = batch
	}
	calls := map[jsonrpc.ID]bool{}
	for _, m := range msgs {
		msg, err := jsonrpc.DecodeMessage(m)
		if req, ok := msg.(*jsonrpc.Request); ok && err == nil && req.IsCall() && len(msgs) > 1 {
			// The SDK ends the whole session at a batch that repeats an id.
			if calls[req.ID] {
				r.Error.Code = jsonrpc.CodeInvalidRequest
				r.Error.Message = fmt.Sprintf("Invalid Request: the batch repeats request id %v", req.ID.Raw())
				return r
			}
			calls[req.ID] = true
		}
		if err != nil {
			// Answer under the request's id when it has a usable one, so the
			// client can match the error to its request.
			var probe struct {
				ID json.RawMessage `json:"id"`
			}
			if len(msgs) == 1 && json.Unmarshal(m, &probe) == nil && validID(probe.ID) {
				r.ID = probe.ID
			}
			r.Error.Code = jsonrpc.CodeInvalidRequest
			r.Error.Message = fmt.Sprintf("Invalid Request: %v", err)
			return r
		}
	}
	return nil
}

// validID reports whether raw is a JSON-RPC id: a string or a number.
func validID(raw json.RawMessage) bool {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return false
	}
	switch v.(type) {
	case string, float64:
		return true
	}
	return false
}

// lockedWriter serializes whole-message writes of the SDK and of the
// filter, so that their lines never interleave.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
	// batchCalls are the request ids of batches passed to the SDK and not
	// answered yet. The SDK ends the session at a batch that reuses one of
	// them, so the filter answers such a batch itself; the SDK's answer to
	// a batch (the only array it writes) frees its ids.
	batchCalls map[jsonrpc.ID]bool
	// close closes the streams underneath; nil leaves them open.
	close func() error
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(p) > 0 && p[0] == '[' {
		var answers []json.RawMessage
		_ = json.Unmarshal(p, &answers)
		for _, a := range answers {
			if resp, err := jsonrpc.DecodeMessage(a); err == nil {
				if r, ok := resp.(*jsonrpc.Response); ok {
					delete(l.batchCalls, r.ID)
				}
			}
		}
	}
	return l.w.Write(p)
}

// startBatch splits a well-formed batch into what goes to the SDK: its
// notifications and responses one by one, then its requests as a batch,
// whose ids it records. The SDK's batch tracking takes a notification for
// a request that is never answered: a notification in a batch would hold
// back the batch's answer for ever, and two would end the session. JSON-RPC
// lets a batch be processed in any order, and answers only its requests.
// A batch reusing an id of a batch still in progress gets the error
// answer instead.
func (l *lockedWriter) startBatch(line []byte) ([][]byte, *errorReply) {
	var batch []json.RawMessage
	_ = json.Unmarshal(line, &batch)
	var forward [][]byte
	var calls []json.RawMessage
	var ids []jsonrpc.ID
	for _, m := range batch {
		msg, _ := jsonrpc.DecodeMessage(m) // checkMessage decoded each
		if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
			calls = append(calls, m)
			ids = append(ids, req.ID)
			continue
		}
		var c bytes.Buffer
		_ = json.Compact(&c, m) // one line
		forward = append(forward, c.Bytes())
	}
	if len(calls) > 0 {
		b, _ := json.Marshal(calls) // compact: valid raw messages
		forward = append(forward, b)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if l.batchCalls[id] {
			r := &errorReply{JSONRPC: "2.0", ID: json.RawMessage("null")}
			r.Error.Code = jsonrpc.CodeInvalidRequest
			r.Error.Message = fmt.Sprintf("Invalid Request: request id %v is still in progress in an earlier batch", id.Raw())
			return nil, r
		}
	}
	if l.batchCalls == nil {
		l.batchCalls = map[jsonrpc.ID]bool{}
	}
	for _, id := range ids {
		l.batchCalls[id] = true
	}
	return forward, nil
}

// Close closes the wrapped transport's streams as the SDK would have;
// the SDK calls it once, when the session ends.
func (l *lockedWriter) Close() error {
	if l.close == nil {
		return nil
	}
	return l.close()
}

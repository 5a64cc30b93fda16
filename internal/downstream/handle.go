package downstream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

const (
	keyHeader      = "Idempotency-Key"
	replayedHeader = "Idempotent-Replayed"
	lookupPrefix   = "/v1/idempotency/"
	maxKeyBytes    = 255 // Stripe's limit
)

// keyState is what the server remembers about a key.
type keyState struct {
	method, path string
	body         []byte
	first        response // the response of the first executed request
	inFlight     bool     // that request has not finished
}

type response struct {
	status int
	header http.Header // besides Content-Type
	body   []byte
}

// decision is what handle does with a request once it is recorded.
type decision struct {
	seq   int
	fault Fault
	resp  response
	held  string // the key this request holds in flight; "" if none
}

// handle serves every path itself rather than through a ServeMux, which
// would answer requests for unclean paths with a redirect before the fake
// could record them.
func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		panic(http.ErrAbortHandler) // drops the connection without a response
	}
	defer s.leave()

	body, readErr := io.ReadAll(r.Body)
	d := s.decide(r, body, readErr)

	switch d.fault.kind {
	case resetFault:
		s.finish(d, 0)
		dropConn(w, true)
	case acceptThenCloseFault:
		s.finish(d, 0)
		dropConn(w, false)
	case slowFault:
		t := time.NewTimer(d.fault.delay)
		defer t.Stop()
		s.deliverIf(w, d, await(r.Context(), s.closing, t.C))
	case holdFault:
		s.deliverIf(w, d, await(r.Context(), s.closing, d.fault.release))
	case hangFault:
		s.deliverIf(w, d, await[struct{}](r.Context(), s.closing, nil))
	default:
		s.finish(d, d.resp.status)
		d.resp.write(w)
	}
}

// decide records the request and settles its outcome in one critical
// section, so that a waiter woken by the arrival sees the key already held.
func (s *Server) decide(r *http.Request, body []byte, readErr error) decision {
	key, keyErr := parseKey(r.Header)
	lookupKey, lookup := strings.CutPrefix(r.URL.Path, lookupPrefix)
	lookup = lookup && r.Method == http.MethodGet && lookupKey != ""

	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.signal()
	req := Request{
		Seq:    len(s.reqs) + 1,
		Time:   time.Now(),
		Method: r.Method,
		Path:   r.URL.RequestURI(),
		Header: r.Header.Clone(),
		Body:   body,
		Key:    key,
	}
	d := decision{seq: req.Seq}
	switch {
	case readErr != nil:
		req.Outcome = Incomplete
		d.resp = errorResponse(http.StatusBadRequest, "invalid_request_error", "", fmt.Sprintf("read request body: %v", readErr))
	default:
		d.fault = s.takeFault(r.URL.Path, lookup, key)
		if d.fault.kind == noFault && !lookup && s.faultFunc != nil {
			d.fault = s.faultFunc(r.Method, r.URL.Path, key)
		}
		req.Fault = d.fault.String()
		switch d.fault.kind {
		case statusFault, retryAfterFault:
			req.Outcome = Faulted
			d.resp = faultResponse(d.fault)
		case resetFault:
			req.Outcome = Faulted
		default:
			switch {
			case lookup:
				req.Outcome = Probed
				d.resp = s.lookup(lookupKey)
			case keyErr != nil:
				req.Outcome = Invalid
				d.resp = errorResponse(http.StatusBadRequest, "idempotency_error", "", keyErr.Error())
			default:
				req.Outcome, d.resp, d.held = s.dedup(&req)
			}
		}
	}
	s.reqs = append(s.reqs, req)
	return d
}

// dedup applies req or answers it from its key. s.mu must be held.
func (s *Server) dedup(req *Request) (Outcome, response, string) {
	if req.Key == "" {
		return s.execute(req)
	}
	st := s.keys[req.Key]
	if s.noDedup {
		outcome, resp, _ := s.execute(req)
		if st == nil && outcome == Executed {
			s.keys[req.Key] = &keyState{method: req.Method, path: req.Path, body: req.Body, first: resp}
		}
		return outcome, resp, ""
	}
	switch {
	case st == nil:
		outcome, resp, _ := s.execute(req)
		if outcome != Executed {
			return outcome, resp, ""
		}
		s.keys[req.Key] = &keyState{method: req.Method, path: req.Path, body: req.Body, first: resp, inFlight: true}
		return Executed, resp, req.Key
	// A mismatch is reported even while the first request is in flight:
	// unlike 409 it is not worth retrying.
	case st.method != req.Method || st.path != req.Path || !bytes.Equal(st.body, req.Body):
		msg := fmt.Sprintf("idempotency key %q was first used with another request (%s %s); "+
			"a key can only be reused with the same method, path and body", req.Key, st.method, st.path)
		return Mismatch, errorResponse(http.StatusUnprocessableEntity, "idempotency_error", req.Key, msg), ""
	case st.inFlight:
		msg := fmt.Sprintf("a request with idempotency key %q is still being processed; retry later", req.Key)
		return Conflict, errorResponse(http.StatusConflict, "idempotency_error", req.Key, msg), ""
	}
	return Replayed, response{
		status: st.first.status,
		header: http.Header{replayedHeader: {"true"}},
		body:   st.first.body,
	}, ""
}

// execute applies req's effect and builds its response. s.mu must be held.
// With a journal, the effect is applied only once its line is written;
// if that fails, nothing is applied and the request gets 500.
func (s *Server) execute(req *Request) (Outcome, response, string) {
	e := Effect{
		ID: fmt.Sprintf("ch_%d", len(s.applied)+1), Seq: req.Seq, Key: req.Key, Method: req.Method, Path: req.Path, Body: req.Body,
	}
	if err := s.record(e); err != nil {
		return Faulted, errorResponse(http.StatusInternalServerError, "api_error", "", err.Error()), ""
	}
	s.applied = append(s.applied, e)
	return Executed, executedResponse(e.ID, e.Path, e.Body), ""
}

// executedResponse is the response of an executed request, the same for
// the request and, after a restart, for a replay loaded from the journal.
func executedResponse(id, path string, reqBody []byte) response {
	body, err := json.Marshal(struct {
		ID       string          `json:"id"`
		Object   string          `json:"object"`
		Path     string          `json:"path"`
		Received json.RawMessage `json:"received"`
	}{id, "charge", path, received(reqBody)})
	if err != nil {
		panic(fmt.Sprintf("downstream: marshal response: %v", err)) // every field is marshalable
	}
	return response{status: http.StatusOK, body: body}
}

// received echoes a request body: as JSON if it is JSON, else as a string.
func received(body []byte) json.RawMessage {
	if len(bytes.TrimSpace(body)) == 0 {
		return json.RawMessage("null")
	}
	var buf bytes.Buffer
	if json.Compact(&buf, body) == nil {
		return buf.Bytes()
	}
	s, _ := json.Marshal(string(body)) // a string always marshals
	return s
}

// lookup answers GET /v1/idempotency/{key}. s.mu must be held.
func (s *Server) lookup(key string) response {
	st := s.keys[key]
	if st == nil {
		return errorResponse(http.StatusNotFound, "invalid_request_error", key,
			fmt.Sprintf("no request with idempotency key %q was applied", key))
	}
	return response{status: http.StatusOK, body: st.first.body}
}

// await reports whether ready fired before the client left or the server
// closed; a nil ready never fires.
func await[T any](ctx context.Context, closing <-chan struct{}, ready <-chan T) bool {
	select {
	case <-ready:
		return true
	case <-ctx.Done():
		return false
	case <-closing:
		return false
	}
}

// deliverIf sends d's response if ok, and otherwise drops the connection:
// returning without a response would make net/http send an empty 200.
func (s *Server) deliverIf(w http.ResponseWriter, d decision, ok bool) {
	if !ok {
		s.finish(d, 0)
		dropConn(w, false)
		return
	}
	s.finish(d, d.resp.status)
	d.resp.write(w)
}

// finish marks d's request done: its status, and its key out of flight. It
// runs before the response is written, so that a client that reads the
// response and retries at once finds the key settled.
func (s *Server) finish(d decision, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs[d.seq-1].Status = status
	if d.held != "" {
		s.keys[d.held].inFlight = false
	}
	s.signal()
}

func (r response) write(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range r.header {
		h[k] = v
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body) // a client that left is not the fake's problem
}

// dropConn closes the connection under the handler without a response: with
// a TCP RST if rst, else with a FIN.
func dropConn(w http.ResponseWriter, rst bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // still drops the connection, with a FIN
	}
	if tcp, ok := conn.(*net.TCPConn); ok && rst {
		_ = tcp.SetLinger(0) // Close then sends RST and discards unsent data
	}
	_ = conn.Close()
}

func errorResponse(status int, typ, key, msg string) response {
	type apiError struct {
		Type           string `json:"type"`
		Message        string `json:"message"`
		IdempotencyKey string `json:"idempotency_key,omitempty"`
	}
	body, err := json.Marshal(struct {
		Error apiError `json:"error"`
	}{apiError{typ, msg, key}})
	if err != nil {
		panic(fmt.Sprintf("downstream: marshal error: %v", err)) // strings always marshal
	}
	return response{status: status, body: body}
}

func faultResponse(f Fault) response {
	typ := "api_error"
	switch {
	case f.status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case f.status < 500:
		typ = "invalid_request_error"
	}
	resp := errorResponse(f.status, typ, "", "injected fault: "+f.String())
	if f.kind == retryAfterFault {
		resp.header = http.Header{"Retry-After": {f.retryAfter}}
	}
	return resp
}

// parseKey returns the request's key without quotes, "" if it has none.
func parseKey(h http.Header) (string, error) {
	vals := h.Values(keyHeader)
	switch len(vals) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("parse %s: sent on %d header lines, want one", keyHeader, len(vals))
	}
	raw := strings.Trim(vals[0], " \t")
	key := raw
	if strings.HasPrefix(raw, `"`) {
		var err error
		if key, err = unquote(raw); err != nil {
			return "", fmt.Errorf("parse %s %s: %w", keyHeader, raw, err)
		}
	}
	switch {
	case key == "":
		return "", fmt.Errorf("parse %s: empty", keyHeader)
	case len(key) > maxKeyBytes:
		return "", fmt.Errorf("parse %s: %d bytes, the limit is %d", keyHeader, len(key), maxKeyBytes)
	}
	return key, nil
}

// unquote parses a Structured Field string (RFC 9651, section 3.3.3) at the
// start of v. Parameters after it are ignored: they are not part of the key.
func unquote(v string) (string, error) {
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			i++
			if i == len(v) || v[i] != '"' && v[i] != '\\' {
				return "", errors.New("bad escape: only \\\" and \\\\ are allowed")
			}
			b.WriteByte(v[i])
		case c == '"':
			if rest := v[i+1:]; rest != "" && rest[0] != ';' {
				return "", fmt.Errorf("unexpected %q after the closing quote", rest)
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte %#x is not allowed in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("no closing quote")
}

package mcphttp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"
)

// DefaultBodyTimeout is [Options.BodyTimeout] when zero: how long a
// request's body may take to arrive, from the end of its headers. The
// largest body the endpoint reads is the go-sdk's 4 MiB
// (mcp.DefaultMaxRequestBodyBytes); 30 s carries it at about 1.1 Mbit/s,
// below a poor mobile link's upload rate (3G's is a few Mbit/s), and the
// bodies of tools/call requests are usually a few KiB. A client that
// sends less than that in 30 s is either broken or holding the connection
// on purpose.
const DefaultBodyTimeout = 30 * time.Second

// bodyTimeout is ServeWith's middleware that bounds the time a request's
// body takes to arrive, by a read deadline on the connection set before
// the handler runs and cleared once the body was read to its end.
//
// A read deadline on the connection is safe only while the body is being
// read. While a handler runs, net/http reads the connection in the
// background to notice the client leaving, and takes a deadline passing
// there for the client gone: it cancels the request's context (Go issue
// 70834). That background read starts when the body's end is reached, and
// for a request without a body before its handler runs. So a request
// without a body (an event stream's GET) gets no deadline here at all,
// and a body's deadline is cleared at its end (Go 1.26's net/http clears
// it too as its background read starts: connReader.startBackgroundRead).
//
// Why not http.Server.ReadTimeout: it would bound the same thing (from the
// first byte of the headers), but the handler would answer its own 400 for
// the timed-out body, and net/http takes ReadTimeout for the idle bound
// when IdleTimeout is not set, so that Options.IdleTimeout could not be
// turned off alone. (That ReadTimeout cuts event streams is no longer so:
// TestServeWith_BodyBoundEndsWithBody and TestServeWith_StreamOutlivesBounds
// pass with it too, on Go 1.26.)
//
// Whatever handler reads the body (the go-sdk's, LiftParamsKey's, a
// form's, the operator API's JSON), it sees a read error when the
// deadline passes, and answers it as it answers a bad body, usually 400;
// the client gets 408 instead, with Connection: close, and the handler's
// own text is dropped: see timeoutWriter.
func bodyTimeout(d time.Duration, h http.Handler) http.Handler {
	if d <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(d)) != nil {
			h.ServeHTTP(w, r) // a writer that cannot; serve without the bound
			return
		}
		tw := &timeoutWriter{ResponseWriter: w, bound: d}
		r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, w: tw}
		h.ServeHTTP(tw, r)
		tw.finish()
	})
}

// deadlineBody clears the read deadline once the body was read to its end,
// and tells its timeoutWriter when the deadline passed instead.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	w    *timeoutWriter
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == nil || b.done:
	case errors.Is(err, io.EOF):
		// The background read that begins here must not inherit the
		// deadline (see bodyTimeout); a deadline set now applies to that
		// pending read too.
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.done = true
		b.w.timedOut()
	}
	return n, err
}

// timeoutWriter answers 408 for a handler whose body read timed out: the
// handler's own status (400, or whatever its error for an unreadable body
// is) and text are replaced. A handler that had answered before the
// deadline passed keeps its answer.
type timeoutWriter struct {
	http.ResponseWriter
	bound time.Duration

	mu      sync.Mutex
	timeout bool // the body's deadline passed before an answer began
	wrote   bool // an answer began (the handler's or the 408)
}

func (w *timeoutWriter) timedOut() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.wrote {
		w.timeout = true
	}
}

// answer408 writes the 408 the first time a timed-out handler answers; it
// reports whether the handler's answer is to be dropped.
func (w *timeoutWriter) answer408() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.timeout {
		w.wrote = true
		return false
	}
	if !w.wrote {
		w.wrote = true
		h := w.ResponseWriter.Header()
		for k := range h {
			delete(h, k)
		}
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("X-Content-Type-Options", "nosniff")
		// The rest of the body may still come; the connection cannot
		// carry another request.
		h.Set("Connection", "close")
		w.ResponseWriter.WriteHeader(http.StatusRequestTimeout)
		fmt.Fprintf(w.ResponseWriter, "request body not received within %v (the server's body timeout)\n", w.bound)
	}
	return true
}

func (w *timeoutWriter) WriteHeader(code int) {
	if w.answer408() {
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *timeoutWriter) Write(p []byte) (int, error) {
	if w.answer408() {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

// finish answers 408 for a handler that timed out and returned without an
// answer of its own.
func (w *timeoutWriter) finish() { w.answer408() }

// Flush and Unwrap keep http.ResponseController working through the
// wrapper: go-sdk flushes every event with it.
func (w *timeoutWriter) Flush() {
	if w.answer408() {
		return
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *timeoutWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

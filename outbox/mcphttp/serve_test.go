package mcphttp

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// slowServer serves, on 127.0.0.1, an event stream at GET (it ends only
// with its request) and at POST a request that answers once release is
// closed; started is closed when the POST runs. ServeWith's error arrives
// on served once cancel is called.
type slowServer struct {
	url     string
	started chan struct{}
	release chan struct{}
	served  chan error
	cancel  context.CancelFunc
}

func startSlow(t *testing.T, opts *Options) *slowServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &slowServer{url: "http://" + ln.Addr().String(), started: make(chan struct{}), release: make(chan struct{}),
		served: make(chan error, 1)}
	var once sync.Once
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		once.Do(func() { close(s.started) })
		<-s.release
		io.WriteString(w, "done")
	})
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.served <- ServeWith(ctx, ln, h, opts) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.release:
		default:
			close(s.release)
		}
	})
	return s
}

// openStream opens the event stream and returns once its headers came.
func (s *slowServer) openStream(t *testing.T) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, s.url, nil)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
}

// post starts the slow POST and returns where its answer (or error) comes.
func (s *slowServer) post(t *testing.T) <-chan string {
	t.Helper()
	answer := make(chan string, 1)
	go func() {
		resp, err := http.Post(s.url, "application/json", strings.NewReader("{}"))
		if err != nil {
			answer <- "error: " + err.Error()
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			answer <- "error: " + err.Error()
			return
		}
		answer <- string(b)
	}()
	select {
	case <-s.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the POST did not reach the handler")
	}
	return answer
}

func (s *slowServer) wantServed(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case err := <-s.served:
		if err != nil {
			t.Fatalf("ServeWith: %v, want nil", err)
		}
	case <-time.After(within):
		t.Fatalf("ServeWith did not return within %s of its context's end", within)
	}
}

// TestServeWith_WaitsForCallsNotStreams: once its context ends, ServeWith
// waits for a request in flight, which gets its answer, but not for an
// event stream, which never ends on its own: the old Serve waited for it
// until its bound and returned "context deadline exceeded".
func TestServeWith_WaitsForCallsNotStreams(t *testing.T) {
	t.Parallel()
	s := startSlow(t, &Options{ShutdownTimeout: time.Minute})
	s.openStream(t)
	answer := s.post(t)
	s.cancel()
	// The shutdown began once the listener refuses; had ServeWith cut the
	// request then, its answer would be an error.
	addr := strings.TrimPrefix(s.url, "http://")
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the listener still accepts 10s after the context ended")
		}
		time.Sleep(time.Millisecond) // polling the listener, with a deadline
	}
	close(s.release)
	if got := <-answer; got != "done" {
		t.Errorf("the request in flight got %q, want its answer", got)
	}
	s.wantServed(t, 10*time.Second)
}

// TestServeWith_HandsOverAtBound: a request still running when the bound
// passes is cut, ServeWith says so in the log and returns nil.
func TestServeWith_HandsOverAtBound(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	s := startSlow(t, &Options{ShutdownTimeout: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s.openStream(t)
	answer := s.post(t)
	s.cancel()
	s.wantServed(t, 10*time.Second)
	if got := <-answer; !strings.HasPrefix(got, "error: ") {
		t.Errorf("the request cut at the bound got %q, want no answer", got)
	}
	if l := logs.String(); !strings.Contains(l, "were handed over") || !strings.Contains(l, "running=1") {
		t.Errorf("log %q, want the request handed over, running=1", l)
	}
	if l := logs.String(); !strings.Contains(l, "waiting for the requests in flight") {
		t.Errorf("log %q, want the wait announced before it began", l)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

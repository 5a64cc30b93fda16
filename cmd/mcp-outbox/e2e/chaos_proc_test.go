package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Processes of the chaos soak: every server and the downstream run as real
// processes, so that the monkey's kills are real SIGKILLs. Their stderr
// goes to one log file, each line prefixed with the process's name, which
// the test shows the end of when it fails.

// chaosLog is the shared log of the soak's processes.
type chaosLog struct {
	mu   sync.Mutex
	f    *os.File
	path string
}

func newChaosLog(path string) (*chaosLog, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create process log: %w", err)
	}
	return &chaosLog{f: f, path: path}, nil
}

func (l *chaosLog) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.f, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
}

// tail returns the last n lines of the log.
func (l *chaosLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, err := os.ReadFile(l.path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// grep returns the log's lines that contain any of words.
func (l *chaosLog) grep(words ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, _ := os.ReadFile(l.path)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(line, w) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

func (l *chaosLog) close() { l.f.Close() }

// chaosLineWriter is a process's stdout or stderr: it copies whole lines to the
// log under the process's name, and hands the rest of the first line
// containing marker to found (how a process says where it listens).
type chaosLineWriter struct {
	log    *chaosLog
	name   string
	marker string
	found  chan string // buffered 1; nil when nothing is awaited

	mu        sync.Mutex
	buf       []byte
	announced bool // found has its value
}

func newChaosLineWriter(log *chaosLog, name, marker string) *chaosLineWriter {
	w := &chaosLineWriter{log: log, name: name, marker: marker}
	if marker != "" {
		w.found = make(chan string, 1)
	}
	return w
}

func (w *chaosLineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := string(w.buf[:i])
		w.buf = w.buf[i+1:]
		w.log.printf("[%s] %s", w.name, line)
		if w.found != nil && !w.announced {
			if _, rest, ok := strings.Cut(line, w.marker); ok {
				w.found <- strings.TrimSpace(rest)
				w.announced = true
			}
		}
	}
}

var _ io.Writer = (*chaosLineWriter)(nil)

// chaosProc is a started process whose Wait runs in the background.
type chaosProc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process is reaped
	err    error         // Wait's result, set before exited closes
}

// startChaosProc starts cmd, whose output goes to out, and waits until it
// prints out's marker, returning what follows it. It fails when the process
// exits first or timeout passes; the process is then killed and reaped.
func startChaosProc(cmd *exec.Cmd, out *chaosLineWriter, timeout time.Duration) (*chaosProc, string, error) {
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &chaosProc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case s := <-out.found:
		return p, s, nil
	case <-p.exited:
		return nil, "", fmt.Errorf("%s exited before it was ready: %v", out.name, p.err)
	case <-t.C:
		p.kill(context.Background())
		return nil, "", fmt.Errorf("%s was not ready within %s", out.name, timeout)
	}
}

// kill sends SIGKILL and waits until the process is reaped. It reports
// whether the process died of that SIGKILL (false if it had exited
// already).
func (p *chaosProc) kill(ctx context.Context) (bool, error) {
	select {
	case <-p.exited:
		return false, nil
	default:
	}
	err := p.cmd.Process.Signal(syscall.SIGKILL)
	if errors.Is(err, os.ErrProcessDone) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("kill %d: %w", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.exited:
		ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, nil
	case <-ctx.Done():
		return true, fmt.Errorf("process %d not reaped after SIGKILL: %w", p.cmd.Process.Pid, ctx.Err())
	}
}

package downstream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// A journal is how a Server's record of applied effects outlives its
// process, as a real API's database does: a test that SIGKILLs the fake and
// starts it again on the same file gets a server that still knows every
// key it applied, and replays them rather than applying them twice.
//
// One JSON line per applied effect, appended under the server's lock
// before the key is saved in memory and before any response is written:
// the line is the commit point. The write is not fsynced; it survives the
// process being killed (the kernel has the data), not a power loss.

// journalEntry is one line of the journal.
type journalEntry struct {
	ID     string `json:"id"`
	Key    string `json:"key,omitempty"`
	Method string `json:"method"`
	Path   string `json:"path"`
	Body   []byte `json:"body"`
}

// openJournal loads the effects recorded in the journal at path, creating
// the file if missing, and returns it open for appending. A last line cut
// short (the process died in the middle of writing it) was never applied:
// no response was sent for it. It is cut off, so that the next line starts
// clean.
func openJournal(path string) (*os.File, []journalEntry, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("open journal: %w", err)
	}
	var entries []journalEntry
	var good int64 // bytes up to the end of the last complete line
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			break // line, if any, has no newline: cut short
		}
		if err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("read journal: %w", err)
		}
		var e journalEntry
		if err := json.Unmarshal(bytes.TrimSpace(line), &e); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("read journal: line %d: %w", len(entries)+1, err)
		}
		entries = append(entries, e)
		good += int64(len(line))
	}
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("truncate journal: %w", err)
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("seek journal: %w", err)
	}
	return f, entries, nil
}

// load rebuilds what the journal's entries applied: the effects and, for
// keyed ones, the saved response that a retry gets replayed. It runs
// before the server takes requests.
func (s *Server) load(entries []journalEntry) {
	for _, e := range entries {
		s.applied = append(s.applied, Effect{ID: e.ID, Key: e.Key, Method: e.Method, Path: e.Path, Body: e.Body})
		if e.Key != "" && s.keys[e.Key] == nil {
			s.keys[e.Key] = &keyState{method: e.Method, path: e.Path, body: e.Body, first: executedResponse(e.ID, e.Path, e.Body)}
		}
	}
}

// record appends an applied effect to the journal, if there is one. s.mu
// must be held. On an error the effect must not be applied: the first
// error is kept for Close to return.
func (s *Server) record(e Effect) error {
	if s.journal == nil {
		return nil
	}
	if s.journalErr != nil {
		return s.journalErr
	}
	line, err := json.Marshal(journalEntry{ID: e.ID, Key: e.Key, Method: e.Method, Path: e.Path, Body: e.Body})
	if err == nil {
		_, err = s.journal.Write(append(line, '\n'))
	}
	if err != nil {
		s.journalErr = fmt.Errorf("write journal: %w", err)
	}
	return s.journalErr
}

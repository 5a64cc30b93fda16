package sidecar

import (
	"bufio"
	"bytes"
	"io"
	"strconv"
	"time"
)

// maxSSEEvent bounds the bytes of one server-sent event (the go-sdk's
// default, mcp.DefaultMaxEventSize); a larger event is skipped.
const maxSSEEvent = 16 << 20

// sseEvent is one event of a text/event-stream, as the WHATWG HTML
// standard's "interpreting an event stream" reads it.
type sseEvent struct {
	name     string // the event field; "" is the default, "message"
	data     []byte // the data fields joined by newlines; nil without any
	id       string
	hasID    bool          // the event had an id field (possibly empty)
	retry    time.Duration // the retry field; -1 without one
	tooLarge bool          // the event was larger than the limit: name and data are lost
}

// sseReader reads events from a text/event-stream.
type sseReader struct {
	r       *bufio.Reader
	max     int  // bytes of one event
	afterCR bool // the last line ended in CR: an LF right after it is part of that end
	started bool // the byte order mark, if any, is behind
}

func newSSEReader(r io.Reader, max int) *sseReader {
	return &sseReader{r: bufio.NewReader(r), max: max}
}

// next returns the next event: one with a field at least, comments alone
// make none. It returns the stream's error (io.EOF when it ended); an event
// cut off by the end is lost, as the standard says.
func (s *sseReader) next() (sseEvent, error) {
	ev := sseEvent{retry: -1}
	var data []byte
	seen, size := false, 0
	for {
		line, long, err := s.line(s.max - size)
		if err != nil {
			return sseEvent{}, err
		}
		if !s.started {
			s.started = true
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
		}
		if len(line) == 0 && !long {
			if !seen {
				continue // blank lines between events, or after comments
			}
			if data != nil && !ev.tooLarge {
				ev.data = data[:len(data)-1] // the newline after the last data line
			}
			return ev, nil
		}
		size += len(line)
		if long {
			// The rest of the event is skipped, fields and all.
			ev.tooLarge, seen = true, true
			continue
		}
		if line[0] == ':' {
			continue // a comment
		}
		seen = true
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], bytes.TrimPrefix(line[i+1:], []byte(" "))
		}
		switch string(field) {
		case "event":
			ev.name = string(value)
		case "data":
			if !ev.tooLarge {
				data = append(append(data, value...), '\n')
			}
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				ev.id, ev.hasID = string(value), true
			}
		case "retry":
			if ms, err := strconv.ParseUint(string(value), 10, 31); err == nil {
				ev.retry = time.Duration(ms) * time.Millisecond
			}
		}
	}
}

// line reads a line, ended by LF, CR or CRLF, without its end. Beyond
// budget bytes the line is cut, and long reports it.
func (s *sseReader) line(budget int) (line []byte, long bool, err error) {
	for {
		b, err := s.r.ReadByte()
		if err != nil {
			return nil, false, err
		}
		if s.afterCR {
			s.afterCR = false
			if b == '\n' {
				continue
			}
		}
		switch b {
		case '\n':
			return line, long, nil
		case '\r':
			s.afterCR = true
			return line, long, nil
		}
		if len(line) < budget {
			line = append(line, b)
		} else {
			long = true
		}
	}
}

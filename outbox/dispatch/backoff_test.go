package dispatch

import (
	"net/http"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	base, max := time.Second, time.Minute
	for attempt, full := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 6: 32 * time.Second, 7: time.Minute, 60: time.Minute, 2000: time.Minute} {
		lo, hi := backoff(attempt, base, max, 0), backoff(attempt, base, max, 0.999999)
		if lo != full/2 {
			t.Errorf("attempt %d: lowest delay %s, want %s (half the schedule)", attempt, lo, full/2)
		}
		if hi > full || hi < full*99/100 {
			t.Errorf("attempt %d: highest delay %s, want just under %s", attempt, hi, full)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		value string
		want  time.Duration
		ok    bool
	}{
		{"", 0, false},
		{"120", 2 * time.Minute, true},
		{"0", 0, true},
		{"-5", 0, false},
		{"soon", 0, false},
		{"999999", time.Hour, true}, // capped
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true}, // in the past: now
	} {
		h := http.Header{}
		if tc.value != "" {
			h.Set("Retry-After", tc.value)
		}
		got, ok := retryAfter(h, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Retry-After %q = %s, %v; want %s, %v", tc.value, got, ok, tc.want, tc.ok)
		}
	}
}

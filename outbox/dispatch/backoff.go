package dispatch

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// backoff is the delay before retry number attempt (from 1) of an effect:
// exponential from base, capped at max, with "equal jitter": half of the
// delay is fixed and half is random, so retries of many effects that failed
// together spread out, while no retry comes sooner than half the schedule.
// rnd returns a number in [0, 1).
func backoff(attempt int, base, max time.Duration, rnd float64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := float64(base) * math.Pow(2, float64(attempt-1))
	if d > float64(max) || math.IsInf(d, 0) {
		d = float64(max)
	}
	half := d / 2
	return time.Duration(half + half*rnd)
}

// maxRetryAfter caps a downstream's Retry-After: a bogus far-future value
// must not park an effect for days.
const maxRetryAfter = time.Hour

// retryAfter parses a Retry-After header (RFC 9110 section 10.2.3): delay
// seconds or an HTTP-date. It reports false when the header is absent or
// unparseable. The result is capped at one hour and is never negative.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	var d time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		d = time.Duration(min(secs, int64(maxRetryAfter/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = t.Sub(now)
	} else {
		return 0, false
	}
	return min(max(d, 0), maxRetryAfter), true
}

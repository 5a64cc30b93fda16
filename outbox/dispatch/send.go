package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/failpoint"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/metrics"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/otelattr"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
)

// Failpoints on the delivery path.
const (
	fpDispatchAfterClaim    = "dispatch.after_claim"
	fpDispatchAfterSend     = "dispatch.after_send"
	fpDispatchAfterResponse = "dispatch.after_response"
)

// deliver makes one attempt of e, has its outcome recorded, and returns
// the effect its slot serves next (see next); nil when the slot is free.
func (d *Dispatcher) deliver(ctx context.Context, ds *destState, e *claimedEffect) *claimedEffect {
	_ = failpoint.Inject(fpDispatchAfterClaim)
	d.sending.Store(e.id, struct{}{})
	now := d.now()
	if age := now.Sub(time.UnixMilli(e.createdAt)); age > ds.MaxAge {
		return d.finish(ctx, ds, e, outcome{state: "dead", err: fmt.Sprintf("gave up: effect is %s old, the limit is %s", age.Round(time.Second), ds.MaxAge)}, 0)
	}
	if e.unreadable != nil {
		// Never sent: a tampered or erased value stays refused (dead, for an
		// operator); a key missing from the key file may come back, so that
		// effect waits and tries again.
		var missing *seal.MissingKeyError
		if errors.As(e.unreadable, &missing) || errors.Is(e.unreadable, sealing.ErrNoKeyRing) {
			return d.finish(ctx, ds, e, outcome{state: "pending", err: "not sent: " + e.unreadable.Error(), next: now.Add(time.Minute)}, 0)
		}
		return d.finish(ctx, ds, e, outcome{state: "dead", err: "not sent: " + e.unreadable.Error()}, 0)
	}
	if ds.AtMostOnce {
		ok, err := d.markSent(ctx, e)
		if err != nil || !ok {
			d.logger.WarnContext(ctx, "not sending: lease lost or database error", "effect", e.id, "error", err)
			if err != nil {
				// Nothing was sent and the lease is still ours: give the
				// effect back now, not counted as an attempt, rather
				// than leave it to wait out its lease. Should that fail
				// too, the lease passes as below.
				if rerr := d.release(ctx, d.stmts.Load(), []*claimedEffect{e}); rerr != nil {
					d.logger.WarnContext(ctx, "release effect", "effect", e.id, "error", rerr)
				}
			}
			d.sending.Delete(e.id)
			d.done() // the lease passes to whoever reclaims it
			return d.next(ds)
		}
	}
	start := time.Now()
	o := d.tracedAttempt(ctx, ds, e)
	took := time.Since(start)
	ds.exchanged(took)
	metrics.DeliveryTime(d.opts.Metrics, ds.Name, took)
	return d.finish(ctx, ds, e, o, took)
}

// finish queues o for recording, which the slot's next attempt need not
// wait for, and returns the slot's next effect. took is the attempt's HTTP
// exchange, zero when the effect was given up without one.
func (d *Dispatcher) finish(ctx context.Context, ds *destState, e *claimedEffect, o outcome, took time.Duration) *claimedEffect {
	next := d.next(ds)
	d.record(ctx, ds, e, o, took)
	return next
}

// attempt sends e once and classifies what happened.
func (d *Dispatcher) attempt(ctx context.Context, ds *destState, e *claimedEffect) outcome {
	target, err := joinURL(ds.URL, e.path)
	if err != nil {
		return outcome{state: "dead", err: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, ds.Timeout)
	defer cancel()
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{
		// WroteRequest fires when the request is in the connection's write
		// buffer, possibly before it is flushed: from then on it may have
		// left, which is the safe side for deciding "unknown".
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) },
		// The failpoint needs a request that surely reached the destination
		// and a response not yet read: the first response byte is both.
		GotFirstResponseByte: func() { _ = failpoint.Inject(fpDispatchAfterSend) },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), e.method, target, bytes.NewReader(e.body))
	if err != nil {
		return outcome{state: "dead", err: fmt.Sprintf("build request: %v", err)}
	}
	if ds.AtMostOnce {
		req.GetBody = nil // belt and braces: not replayable by the transport either
	}
	for k, v := range e.headers {
		req.Header.Set(k, v) // canonical: "content-type" is Content-Type
	}
	if _, own := req.Header["Content-Type"]; !own && json.Valid(e.body) {
		// Most APIs refuse or misread a JSON body sent without its type
		// (net/http's client sets none, and the effect's author seldom
		// thinks of it). Any other body is sent as the effect wrote it:
		// a type guessed wrong is worse than none.
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(callkey.Header, ds.KeyForm.headerValue(e.key))
	otelattr.Propagator.Inject(ctx, propagation.HeaderCarrier(req.Header)) // the attempt's span (trace.go)
	if ds.AuthHeader != "" {
		req.Header.Set(ds.AuthHeader, ds.AuthValue)
	}
	resp, err := ds.client.Do(req)
	if err != nil {
		return d.transportFailure(ds, e, err, wrote.Load())
	}
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, int64(d.opts.ResponseLimit)))
	resp.Body.Close()
	if rerr != nil && !errors.Is(rerr, io.EOF) {
		// The status line arrived, so the destination decided; a truncated
		// body does not change the decision.
		body = append(body, []byte(" [body truncated: "+rerr.Error()+"]")...)
	}
	_ = failpoint.Inject(fpDispatchAfterResponse)
	return d.classify(ds, e, resp, body)
}

// classify maps a response to an outcome.
func (d *Dispatcher) classify(ds *destState, e *claimedEffect, resp *http.Response, body []byte) outcome {
	now := d.now()
	o := outcome{status: resp.StatusCode, response: body}
	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		o.state, o.delivered = "delivered", now
		return o
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests,
		code == http.StatusConflict, code >= 500:
		// 409: the destination is still processing a request with this
		// key (Stripe's behaviour); ask again later with the same key.
		o.err = fmt.Sprintf("HTTP %d", code)
		return d.retry(ds, e, o, resp.Header)
	default:
		o.state, o.err = "dead", fmt.Sprintf("HTTP %d: the destination refused the request", code)
		return o
	}
}

// transportFailure classifies an attempt that got no response.
func (d *Dispatcher) transportFailure(ds *destState, e *claimedEffect, err error, wrote bool) outcome {
	o := outcome{err: describeTransportError(err, wrote)}
	if wrote && ds.AtMostOnce {
		// The request left and its fate is unknown; the destination cannot
		// dedup a second copy. An operator or the probe decides.
		o.state, o.keepSent = "unknown", true
		o.next = d.now().Add(ds.unknownProbeDelay())
		return o
	}
	if errors.Is(err, context.Canceled) {
		// Shutdown cancelled the attempt: the next dispatcher retries at once.
		o.state = "pending"
		return o
	}
	return d.retry(ds, e, o, nil)
}

func describeTransportError(err error, wrote bool) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	msg := err.Error()
	if errors.Is(err, context.DeadlineExceeded) {
		msg = "timed out"
	}
	if wrote {
		return "no response after the request was sent: " + msg
	}
	return "request not sent: " + msg
}

// retry schedules the next attempt, or gives up past the attempt limit.
func (d *Dispatcher) retry(ds *destState, e *claimedEffect, o outcome, h http.Header) outcome {
	if e.attempts >= ds.MaxAttempts {
		o.state = "dead"
		o.err = fmt.Sprintf("gave up after %d attempts: %s", e.attempts, o.err)
		return o
	}
	now := d.now()
	wait := backoff(e.attempts, d.opts.BackoffBase, d.opts.BackoffMax, d.opts.Rand())
	if ra, ok := retryAfter(h, now); ok && ra > wait {
		wait = ra
	}
	o.state, o.next = "pending", now.Add(wait)
	return o
}

// probeURL fills a probe path's {key}.
func probeURL(ds *destState, key string) (string, error) {
	return joinURL(ds.URL, strings.ReplaceAll(ds.Probe.Path, "{key}", url.PathEscape(key)))
}

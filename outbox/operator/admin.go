package operator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/mcp-outbox/mcp-outbox/internal/admin"
	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/internal/visible"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// NewAdmin returns the admin API: the same actions and validation as
// `mcp-outbox outbox`, in JSON, at these paths under Options.BasePath
// (NewHandler mounts it at BasePath + "admin/"):
//
//	GET  /summary                     counts by state, and unknown calls
//	GET  /effects?state=&dest=&limit= effects, newest first
//	GET  /effects/{id}                one effect
//	POST /effects/{id}/retry          (no body, or {})
//	POST /effects/{id}/cancel         (no body, or {})
//	POST /effects/{id}/resolve        {"outcome": "delivered" | "retry"}
//	POST /effects/retry-dead          (no body, or {})
//	POST /effects/retarget            {"from": NAME, "to": NAME}: move every pending
//	                                   effect of destination from to destination to,
//	                                   one Options.Dispatcher delivers to (without
//	                                   one, one the database has delivered to)
//	POST /effects/cancel-pending      {"destination": NAME}: cancel its pending effects
//	GET  /calls/unknown?limit=        calls in state unknown, oldest first
//	POST /calls/resolve               {"principal": P (default local), "key": K,
//	                                   "outcome": "completed" | "failed" | "rerun", "note": TEXT}
//	POST /principals/forget           {"principal": P}: erase P's recorded arguments,
//	                                   results and effect bodies (admin.ForgetPrincipal)
//
// Errors are {"error": "..."}: 400 bad input, 403 refused, 404 no such
// effect or call (or no pending effect for the destination), 409 not in a state the action applies to, 413 body too
// large.
//
// Who may call it: see Options.AdminTokenSHA256.
func NewAdmin(db *schema.DB, opts *Options) http.Handler {
	o := mustOptions(opts)
	h := &adminHandler{db: db, sealer: sealing.Of(o.Keys), logger: o.Logger, dispatcher: o.Dispatcher}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer, adminGuard(newAdminAuth(o)))
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) {
		writeAdminJSON(w, http.StatusNotFound, adminErrorBody{"no such admin endpoint"})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeAdminJSON(w, http.StatusMethodNotAllowed, adminErrorBody{fmt.Sprintf("method %s not allowed here", r.Method)})
	})
	r.Get("/summary", h.summary)
	r.Get("/effects", h.list)
	r.Get("/effects/{id}", h.get)
	r.Post("/effects/retry-dead", h.retryDead)
	r.Post("/effects/retarget", h.retarget)
	r.Post("/effects/cancel-pending", h.cancelDestination)
	for _, a := range operate.EffectActions {
		r.Post("/effects/{id}/"+a.Name(), h.action(a))
	}
	r.Get("/calls/unknown", h.unknownCalls)
	r.Post("/calls/resolve", h.resolveCall)
	r.Post("/principals/forget", h.forgetPrincipal)
	return underBase(o.BasePath, r)
}

type adminHandler struct {
	db *schema.DB
	// sealer seals a resolution's note on an encrypted database.
	sealer *sealing.Sealer
	logger *slog.Logger
	// dispatcher names the destinations a retarget may move effects to.
	dispatcher Dispatcher
}

type adminErrorBody struct {
	Error string `json:"error"`
}

var adminCSRF = http.NewCrossOriginProtection()

// adminGuard admits a request by adminAuth.check: GET and HEAD need read
// access, anything else act. With an admin token it admits whoever
// presents it, from any address; with Options.OAuth, an access token with
// the scope. Without either only a client on this host may use the API.
// That alone would still let any web page the operator visits reach it
// through the browser, so it also refuses requests addressed to any name
// but localhost or a loopback address (DNS rebinding points an attacker's
// name at 127.0.0.1); a page cannot know a token, so with one the Host
// check would only get in a remote operator's way. Cross-origin browser
// requests are refused either way. A reverse proxy on this host would
// make every client look local: without a token, /admin must not be
// proxied.
func adminGuard(ac *adminAuth) func(http.Handler) http.Handler { return guardFor(ac, accessFor) }

// guardFor is adminGuard, with need saying what a request does.
func guardFor(ac *adminAuth, need func(*http.Request) access) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			by, refused := ac.check(r, need(r))
			if refused != nil {
				refused.writeHeader(w)
				writeAdminJSON(w, refused.status, adminErrorBody{refused.msg})
				return
			}
			if err := adminCSRF.Check(r); err != nil {
				writeAdminJSON(w, http.StatusForbidden, adminErrorBody{fmt.Sprintf("cross-origin request refused: %v", err)})
				return
			}
			next.ServeHTTP(w, withOperator(r, by))
		})
	}
}

// accessFor: the admin API reads with GET and HEAD and acts with anything
// else; an unknown path or method is answered 404 or 405 only to a client
// that could act.
func accessFor(r *http.Request) access {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return accessRead
	}
	return accessAct
}

// checkAdminClient is the rule without an admin token: a loopback peer,
// addressing the server by a loopback name.
func checkAdminClient(r *http.Request) error {
	// RemoteAddr is the TCP peer. Nothing may replace it with a header such
	// as X-Forwarded-For (chi's middleware.RealIP would): any client could
	// then claim to be loopback.
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if ip, err := netip.ParseAddr(host); err != nil || !ip.Unmap().IsLoopback() {
		return fmt.Errorf("without an admin token (--admin-token-sha256) the admin API answers only clients on this host over loopback; %s is not a loopback address", host)
	}
	if !operate.LoopbackHost(r.Host) {
		return fmt.Errorf("the admin API answers only requests addressed to localhost or a loopback address, not %q", r.Host)
	}
	return nil
}

func (h *adminHandler) summary(w http.ResponseWriter, r *http.Request) {
	sum, err := operate.SummarizeEffects(r.Context(), h.db)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeAdminJSON(w, http.StatusOK, sum)
}

// listParams are the query parameters of GET /effects. Others are refused:
// a misspelt filter would otherwise list everything.
var listParams = []string{"state", "dest", "limit"}

// listQuery reads a list endpoint's query: only the parameters allowed,
// each at most once, and a limit from 1 to operate.MaxListLimit (default
// operate.DefaultListLimit).
func listQuery(r *http.Request, allowed ...string) (url.Values, int, error) {
	q := r.URL.Query()
	for k, v := range q {
		if !slices.Contains(allowed, k) {
			return nil, 0, operate.BadInputf("unknown parameter %q (want %s)", k, strings.Join(allowed, ", "))
		}
		if len(v) > 1 {
			return nil, 0, operate.BadInputf("parameter %q given %d times", k, len(v))
		}
	}
	limit := operate.DefaultListLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > operate.MaxListLimit {
			return nil, 0, operate.BadInputf("limit %q: want a number from 1 to %d", s, operate.MaxListLimit)
		}
		limit = n
	}
	return q, limit, nil
}

func (h *adminHandler) list(w http.ResponseWriter, r *http.Request) {
	q, limit, err := listQuery(r, listParams...)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	f, err := operate.ParseEffectFilter(q.Get("state"), q.Get("dest"), limit)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	rows, err := opsquery.ListEffects(r.Context(), h.db, f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeAdminJSON(w, http.StatusOK, struct {
		Effects []opsquery.EffectRow `json:"effects"`
	}{rows})
}

func (h *adminHandler) get(w http.ResponseWriter, r *http.Request) {
	id, err := operate.ParseEffectID(chi.URLParam(r, "id"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	e, err := operate.ReadEffect(r.Context(), h.db, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeAdminJSON(w, http.StatusOK, e)
}

func (h *adminHandler) retryDead(w http.ResponseWriter, r *http.Request) {
	if err := readAdminBody(w, r, &struct{}{}); err != nil {
		h.fail(w, r, err)
		return
	}
	n, err := admin.RetryDead(r.Context(), h.db)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.logger.Info("admin action", "action", "retry-dead", "retried", n, "remote", r.RemoteAddr, "by", operatorOf(r))
	writeAdminJSON(w, http.StatusOK, struct {
		Retried int64 `json:"retried"`
	}{n})
}

func (h *adminHandler) action(a operate.EffectAction) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := operate.ParseEffectID(chi.URLParam(r, "id"))
		if err != nil {
			h.fail(w, r, err)
			return
		}
		var body struct {
			Outcome string `json:"outcome"`
		}
		var dst any = &struct{}{}
		if a.TakesOutcome() {
			dst = &body
		}
		if err := readAdminBody(w, r, dst); err != nil {
			h.fail(w, r, err)
			return
		}
		res, err := operate.ApplyEffectAction(r.Context(), h.db, a, id, body.Outcome)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		// The admin token names no user; the log is the audit trail, with
		// the OAuth principal when a token named one.
		h.logger.Info("admin action", "action", a.Name(), "outcome", body.Outcome, "effect", id,
			"from", res.PreviousState, "to", res.Effect.State, "remote", r.RemoteAddr, "by", operatorOf(r))
		if res.Warning != "" {
			h.logger.Warn(res.Warning, "effect", id)
		}
		writeAdminJSON(w, http.StatusOK, res)
	}
}

func (h *adminHandler) unknownCalls(w http.ResponseWriter, r *http.Request) {
	_, limit, err := listQuery(r, "limit")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	calls, err := opsquery.ListUnknownCalls(r.Context(), h.db, limit)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeAdminJSON(w, http.StatusOK, struct {
		Calls []opsquery.UnknownCall `json:"calls"`
	}{calls})
}

func (h *adminHandler) resolveCall(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Principal string `json:"principal"`
		Key       string `json:"key"`
		CallID    string `json:"callId"`
		Outcome   string `json:"outcome"`
		Note      string `json:"note"`
	}
	if err := readAdminBody(w, r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	ref := operate.CallRef{Key: body.Key, CallID: body.CallID}
	if body.CallID == "" {
		ref.Principal = callkey.ParsePrincipal(body.Principal)
	} else if body.Principal != "" {
		h.fail(w, r, operate.BadInputf("give the call's principal and key or its callId, not both"))
		return
	}
	body.Principal = ref.Principal
	res, err := operate.ResolveUnknownCall(r.Context(), h.db, h.sealer, ref, body.Outcome, body.Note)
	if err != nil {
		h.failLogging(w, r, err, operate.RedactKey(err, body.Principal, body.Key))
		return
	}
	// The admin token names no user; the log is the audit trail. The key
	// is logged as the call log writes it: hashed, never raw.
	h.logger.Info("admin action", "action", "resolve-call", "outcome", res.Outcome, "key", callkey.KeyHash(res.Principal, res.Key),
		"tool", res.Tool, "from", res.PreviousState, "to", res.State, "remote", r.RemoteAddr, "by", operatorOf(r))
	writeAdminJSON(w, http.StatusOK, res)
}

// forgetPrincipal erases a principal's recorded arguments, results and
// effect bodies (admin.ForgetPrincipal): POST {"principal": "alice"}.
func (h *adminHandler) forgetPrincipal(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Principal string `json:"principal"`
	}
	if err := readAdminBody(w, r, &body); err != nil {
		h.fail(w, r, err)
		return
	}
	if body.Principal == "" {
		h.fail(w, r, operate.BadInputf("give the principal to forget"))
		return
	}
	principal := body.Principal
	if !strings.HasPrefix(principal, "tenant:") { // a tenant's principal is given as stored
		principal = callkey.ParsePrincipal(principal)
	}
	res, err := admin.ForgetPrincipal(r.Context(), h.db, principal, time.Now())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.logger.Warn("admin action", "action", "forget-principal", "principal", principal, "data_keys", res.DataKeys,
		"calls", res.Calls, "effects", res.Effects, "in_flight", res.InFlight, "remote", r.RemoteAddr, "by", operatorOf(r))
	if res.Unknown {
		// As the CLI exits 1: a script that takes 200 for a request met
		// would file a typo as an erasure done.
		writeAdminJSON(w, http.StatusNotFound, struct {
			Error string `json:"error"`
			*admin.Forgotten
		}{res.UnknownMessage(), res})
		return
	}
	writeAdminJSON(w, http.StatusOK, res)
}

// readAdminBody decodes an optional JSON body into v, strictly: an unknown
// field is more likely a mistake (an outcome sent to /retry) than
// something to ignore.
func readAdminBody(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, operate.MaxAdminBody))
	if err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			return fmt.Errorf("body larger than %d bytes: %w", operate.MaxAdminBody, err)
		}
		return operate.BadInputf("read body: %v", err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return operate.BadInputf("body: %v", err)
	}
	if err := dec.Decode(new(json.RawMessage)); err != io.EOF {
		return operate.BadInputf("body: want one JSON object")
	}
	return nil
}

// fail answers with the status that err's kind calls for.
func (h *adminHandler) fail(w http.ResponseWriter, r *http.Request, err error) {
	h.failLogging(w, r, err, err)
}

// failLogging answers err, logging logged in its place when it is a server
// error: a message that quotes an idempotency key the caller sent is fine
// in the answer, not in the log. A server error is answered in the layer's
// words with an error id, never with its text (fault.go).
func (h *adminHandler) failLogging(w http.ResponseWriter, r *http.Request, err, logged error) {
	if !refusal(err) {
		id := logFault(r.Context(), h.logger, "admin request failed", logged, "method", r.Method, "path", r.URL.Path)
		if databaseAway(h.db, err) {
			// A script can tell an outage it should wait out from a fault.
			w.Header().Set("Retry-After", retryAfterAway)
			writeAdminJSON(w, http.StatusServiceUnavailable, adminFaultBody{awayText(id), id})
			return
		}
		writeAdminJSON(w, http.StatusInternalServerError, adminFaultBody{faultText(id), id})
		return
	}
	status := http.StatusBadRequest
	switch {
	case errors.As(err, new(*http.MaxBytesError)):
		status = http.StatusRequestEntityTooLarge
	case errors.Is(err, admin.ErrNoEffect), errors.Is(err, admin.ErrNoCall), errors.Is(err, admin.ErrNoPending):
		status = http.StatusNotFound
	case errors.Is(err, admin.ErrEffectState), errors.Is(err, admin.ErrNotResolvable), errors.Is(err, admin.ErrCallNotUnknown),
		errors.Is(err, admin.ErrEffectErased), errors.Is(err, admin.ErrSealerNeeded):
		status = http.StatusConflict
	}
	writeAdminJSON(w, status, adminErrorBody{err.Error()})
}

// adminFaultBody answers a server error: the layer's words, and the id
// the log has the error under.
type adminFaultBody struct {
	Error   string `json:"error"`
	ErrorID string `json:"errorId"`
}

func writeAdminJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	var b bytes.Buffer
	_ = json.NewEncoder(&b).Encode(v)
	w.WriteHeader(status)
	// A format character a client sent (in a tool-call id, say) as a \u
	// escape: the same JSON value, and no bidirectional override in a
	// terminal that prints the answer.
	w.Write(visible.JSON(b.Bytes()))
}

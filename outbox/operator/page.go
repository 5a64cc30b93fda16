package operator

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/mcp-outbox/mcp-outbox/internal/callkey"
	"github.com/mcp-outbox/mcp-outbox/outbox/admin"
	"github.com/mcp-outbox/mcp-outbox/query"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The operator page: the state of the outbox at a glance and the operator
// actions of admin.go as buttons, server-rendered, on serve's --http
// listener. It runs no script: every button is a form that POSTs, and the
// answer redirects back with a message.
//
//	GET  /                          the page
//	POST /lookup                    the page, with one call looked up by key
//	POST /effects/{id}/{action}     retry, cancel or resolve (form field outcome)
//	POST /effects/retry-dead        retry every dead effect
//	POST /calls/{id}/resolve        settle an unknown call (page_calls.go)
//	GET  /login, POST /login        exchange the admin token for a session cookie
//	                                (failed attempts limited per client address)
//	POST /logout                    end the session
//	GET  /static/page.css

//go:embed page
var pageFiles embed.FS

var pageTemplates = template.Must(template.New("page").Funcs(template.FuncMap{
	"keyHash":  KeyHash,
	"utc":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"iso":      func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"ago":      func(t time.Time) string { return ago(time.Since(t)) },
	"took":     func(from, to time.Time) string { return tookText(to.Sub(from)) },
	"clip":     func(n int, s string) string { return Shorten(s, n) },
	"px":       func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
	"ref":      func(id int64, state string) effectRef { return effectRef{id, state} },
	"needsOps": func(c query.Counts) int { return c.Dead + c.Unknown },
}).ParseFS(pageFiles, "page/*.html"))

// ago says how long ago something happened, as a person would.
func ago(d time.Duration) string {
	switch {
	case d < 0:
		return "in the future"
	case d < 2*time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	}
	return fmt.Sprintf("%d days ago", int(d.Hours()/24))
}

func tookText(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return "<1 ms"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	}
	return d.Round(100 * time.Millisecond).String()
}

// Bounds of what the page shows and reads, so that it stays fast and
// legible however large the tables grow.
const (
	pageStuckLimit  = 50
	pageCallsLimit  = 20
	pageResultLimit = 2000 // characters of a looked-up call's result
	// MaxPageForm bounds a form body in bytes; the largest form is a key.
	MaxPageForm      = 8 << 10
	maxFlashLen      = 500
	maxPagePrincipal = 256
	// PageSessionTTL is how long a login session of the page lasts.
	PageSessionTTL   = 12 * time.Hour
	maxPageSessions  = 1000
	pageSessionBytes = 32
	pageCookie       = "mcp_outbox_session"
	// After MaxLoginFailures wrong tokens from one client within
	// loginWindow of the first, its logins are refused with 429 until the
	// window ends, the token unchecked. At most maxLoginClients addresses
	// are tracked.
	MaxLoginFailures = 5
	loginWindow      = time.Minute
	maxLoginClients  = 1000
)

// pageHandler serves the operator page for one database.
type pageHandler struct {
	db       *schema.DB
	logger   *slog.Logger
	auth     *adminAuth // nil or without an admin token: loopback only
	sessions pageSessions
	logins   loginLimiter
	// now is the clock of sessions and the login limit; tests replace it.
	now func() time.Time
	// flashKey signs the messages that actions redirect with, so that a link
	// from elsewhere cannot make the page claim that something happened.
	flashKey []byte
}

func newPageHandler(db *schema.DB, logger *slog.Logger, ac *adminAuth) *pageHandler {
	key := make([]byte, 32)
	rand.Read(key) // never fails (crypto/rand panics rather than return an error)
	return &pageHandler{db: db, logger: logger, auth: ac, flashKey: key, now: time.Now,
		sessions: pageSessions{byHash: map[[32]byte]time.Time{}}, logins: loginLimiter{byClient: map[string]loginFailures{}}}
}

func (p *pageHandler) mount(r chi.Router) {
	css, err := fs.ReadFile(pageFiles, "page/page.css")
	if err != nil {
		panic(err) // embedded at build time
	}
	r.Get("/static/page.css", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("Cache-Control", "max-age=300")
		w.Write(css)
	})
	r.Get("/login", p.loginForm)
	r.Post("/login", p.login)
	r.Post("/logout", p.logout)
	r.Get("/", p.guard(p.index))
	r.Post("/lookup", p.guard(p.lookupCall))
	r.Post("/effects/retry-dead", p.guard(p.retryDead))
	for _, a := range effectActions {
		r.Post("/effects/{id}/"+a.name, p.guard(p.action(a)))
	}
	r.Post("/calls/{id}/resolve", p.guard(p.resolveCall))
}

// guard applies the admin API's rule (adminGuard) to a page request, with
// a session cookie from /login accepted in place of the bearer header,
// which a browser cannot send. A request without either is sent to /login
// (GET) or refused (POST). Unsafe methods must come from the page's own
// origin.
func (p *pageHandler) guard(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if p.tokenRequired() {
			if !p.auth.checkAdminToken(r) && !p.sessions.valid(sessionCookie(r), p.now()) {
				if r.Method == http.MethodGet {
					http.Redirect(w, r, "/login", http.StatusSeeOther)
					return
				}
				p.errorPage(w, http.StatusUnauthorized, "Log in first: open /login and paste the admin token.")
				return
			}
		} else if err := checkAdminClient(r); err != nil {
			p.errorPage(w, http.StatusForbidden, err.Error())
			return
		}
		if r.Method != http.MethodGet {
			if err := checkSameOrigin(r); err != nil {
				p.errorPage(w, http.StatusForbidden, err.Error())
				return
			}
		}
		next(w, r)
	}
}

func (p *pageHandler) tokenRequired() bool { return p.auth != nil && p.auth.adminHash != nil }

// checkSameOrigin refuses a cross-origin form post (CSRF). The session
// cookie is SameSite=Strict, which keeps it off such requests in current
// browsers; this check does not depend on it. Sec-Fetch-Site is judged
// first (http.CrossOriginProtection, as /admin does); an Origin header, when
// there is one, must name this host whatever Sec-Fetch-Site said.
func checkSameOrigin(r *http.Request) error {
	if err := adminCSRF.Check(r); err != nil {
		return fmt.Errorf("cross-origin request refused: %v", err)
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return fmt.Errorf("cross-origin request refused: origin %q is not this host (%q)", o, r.Host)
		}
	}
	return nil
}

// pageSessions are the logins of the page: the SHA-256 of each session id
// (so that the map holds nothing a memory dump could replay) and its
// expiry. They live in memory: a restart logs everyone out, which is also
// how to end every session at once.
type pageSessions struct {
	mu     sync.Mutex
	byHash map[[32]byte]time.Time
}

func (s *pageSessions) create(now time.Time) string {
	b := make([]byte, pageSessionBytes)
	rand.Read(b)
	id := hex.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.byHash) >= maxPageSessions {
		s.evict(now)
	}
	s.byHash[sha256.Sum256([]byte(id))] = now.Add(PageSessionTTL)
	return id
}

// evict drops expired sessions and, if none had expired, the one closest to
// expiry: a bounded map, at the cost of the oldest login when an operator
// logs in a thousand times in twelve hours.
func (s *pageSessions) evict(now time.Time) {
	var oldest [32]byte
	var oldestExp time.Time
	for h, exp := range s.byHash {
		if !exp.After(now) {
			delete(s.byHash, h)
			continue
		}
		if oldestExp.IsZero() || exp.Before(oldestExp) {
			oldest, oldestExp = h, exp
		}
	}
	if len(s.byHash) >= maxPageSessions {
		delete(s.byHash, oldest)
	}
}

func (s *pageSessions) valid(id string, now time.Time) bool {
	if id == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.byHash[sha256.Sum256([]byte(id))]
	return ok && exp.After(now)
}

func (s *pageSessions) end(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byHash, sha256.Sum256([]byte(id)))
}

func sessionCookie(r *http.Request) string {
	c, err := r.Cookie(pageCookie)
	if err != nil {
		return ""
	}
	return c.Value
}

// setSessionCookie marks the cookie Secure when the browser reached us over
// TLS: directly, or through a proxy that terminates it and says so. Unlike
// X-Forwarded-For for the loopback rule, trusting that header is safe
// here: it can only keep the cookie off plain HTTP.
func setSessionCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	secure := r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
	http.SetCookie(w, &http.Cookie{
		Name: pageCookie, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure,
	})
}

func (p *pageHandler) loginForm(w http.ResponseWriter, r *http.Request) {
	if !p.tokenRequired() || p.sessions.valid(sessionCookie(r), p.now()) {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	p.render(w, http.StatusOK, "login", loginData{})
}

type loginData struct{ Error string }

func (p *pageHandler) login(w http.ResponseWriter, r *http.Request) {
	if !p.tokenRequired() {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	if err := checkSameOrigin(r); err != nil {
		p.errorPage(w, http.StatusForbidden, err.Error())
		return
	}
	now, client := p.now(), loginClient(r)
	if wait := p.logins.blocked(client, now); wait > 0 {
		secs := int((wait + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		p.render(w, http.StatusTooManyRequests, "login", loginData{Error: fmt.Sprintf(
			"Too many failed logins from this address: wait %d seconds, then try again.", secs)})
		return
	}
	form, err := readPageForm(w, r, "token")
	if err != nil {
		p.render(w, http.StatusBadRequest, "login", loginData{Error: err.Error()})
		return
	}
	if !p.auth.isAdminToken(form.Get("token")) {
		// Repeated refusals in the log are how an operator sees someone
		// guessing.
		p.logger.Warn("operator page login refused", "remote", r.RemoteAddr)
		if p.logins.fail(client, now) {
			p.logger.Warn("operator page logins refused for a while", "client", client,
				"failures", MaxLoginFailures, "for", loginWindow.String())
		}
		p.render(w, http.StatusUnauthorized, "login", loginData{Error: "That is not the admin token."})
		return
	}
	setSessionCookie(w, r, p.sessions.create(now), int(PageSessionTTL.Seconds()))
	p.logger.Info("operator page login", "remote", r.RemoteAddr)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// loginClient is whom failed logins are counted against: the TCP peer's
// address, never a header a client could set (X-Forwarded-For), so that
// behind a reverse proxy every client counts as the proxy. An IPv6 client
// counts as its /64, which one host usually has to itself.
func loginClient(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if ip = ip.Unmap(); ip.Is6() {
		return netip.PrefixFrom(ip.WithZone(""), 64).Masked().String()
	}
	return ip.String()
}

// loginLimiter counts failed logins per client in fixed windows: the first
// failure opens a window of loginWindow; MaxLoginFailures in it close the
// login to that client until it ends. A successful login neither counts nor
// resets the count. The table is bounded: when full, ended windows go
// first, then the oldest.
type loginLimiter struct {
	mu       sync.Mutex
	byClient map[string]loginFailures
}

type loginFailures struct {
	since time.Time // the first failure of the window
	n     int
}

// blocked says how long client must wait before its next login attempt is
// looked at; zero when it may try now.
func (l *loginLimiter) blocked(client string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.byClient[client]
	if !ok {
		return 0
	}
	end := f.since.Add(loginWindow)
	if !end.After(now) {
		delete(l.byClient, client)
		return 0
	}
	if f.n < MaxLoginFailures {
		return 0
	}
	return end.Sub(now)
}

// fail counts a failed login of client and reports whether it reached the
// limit.
func (l *loginLimiter) fail(client string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.byClient[client]
	if !ok || !f.since.Add(loginWindow).After(now) {
		if !ok && len(l.byClient) >= maxLoginClients {
			l.evict(now)
		}
		f = loginFailures{since: now}
	}
	f.n++
	l.byClient[client] = f
	return f.n == MaxLoginFailures
}

// evict drops the ended windows and, if none had ended, the oldest one: a
// client that floods the table from many addresses gains the attempts it
// could make from them anyway.
func (l *loginLimiter) evict(now time.Time) {
	var oldest string
	var oldestSince time.Time
	for c, f := range l.byClient {
		if !f.since.Add(loginWindow).After(now) {
			delete(l.byClient, c)
			continue
		}
		if oldestSince.IsZero() || f.since.Before(oldestSince) {
			oldest, oldestSince = c, f.since
		}
	}
	if len(l.byClient) >= maxLoginClients {
		delete(l.byClient, oldest)
	}
}

func (p *pageHandler) logout(w http.ResponseWriter, r *http.Request) {
	if err := checkSameOrigin(r); err != nil {
		p.errorPage(w, http.StatusForbidden, err.Error())
		return
	}
	if id := sessionCookie(r); id != "" {
		p.sessions.end(id)
	}
	setSessionCookie(w, r, "", -1)
	target := "/"
	if p.tokenRequired() {
		target = "/login"
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// readPageForm reads a urlencoded form body holding at most the named
// fields, each at most once. A stray field is more likely a mistake than
// something to ignore, as in the admin API's bodies.
func readPageForm(w http.ResponseWriter, r *http.Request, fields ...string) (url.Values, error) {
	r.Body = http.MaxBytesReader(w, r.Body, MaxPageForm)
	if err := r.ParseForm(); err != nil {
		return nil, badInputf("read form: %v", err)
	}
	for k, v := range r.PostForm {
		if !slices.Contains(fields, k) {
			return nil, badInputf("unexpected form field %q", k)
		}
		if len(v) > 1 {
			return nil, badInputf("form field %q given %d times", k, len(v))
		}
	}
	return r.PostForm, nil
}

// indexData is everything the page shows.
type indexData struct {
	DBPath   string
	Now      time.Time
	LoggedIn bool // with a session cookie: offer to log out
	Flash    *flash
	Summary  EffectSummary
	ByDest   []query.DestinationCounts
	Stuck    []query.StuckEffect
	// UnknownCalls are the newest of Summary.UnknownCalls.
	UnknownCalls []pageUnknownCall
	Calls        []query.CallRow
	Chart        chart
	Lookup       *lookupResult
}

type lookupResult struct {
	Principal, Key string
	Error          string
	Status         *query.Status
	EffectIDs      map[int]int64
	Result         string
}

// effectRef is what the action buttons of one effect need.
type effectRef struct {
	ID    int64
	State string
}

func (p *pageHandler) index(w http.ResponseWriter, r *http.Request) {
	p.show(w, r, nil)
}

// show renders the page, with the answer to a lookup when there is one.
func (p *pageHandler) show(w http.ResponseWriter, r *http.Request, lookup *lookupResult) {
	now := time.Now().UTC()
	d := indexData{DBPath: p.db.Path, Now: now, Lookup: lookup, Flash: p.readFlash(r.URL.Query()),
		LoggedIn: p.tokenRequired() && p.sessions.valid(sessionCookie(r), now)}
	window := chartWindows[0]
	for _, cw := range chartWindows {
		if r.URL.Query().Get("window") == cw.Name {
			window = cw
		}
	}
	if err := p.read(r.Context(), &d, window); err != nil {
		p.logger.Error("operator page failed", "error", err)
		p.errorPage(w, http.StatusInternalServerError, "Reading the database failed: "+err.Error())
		return
	}
	p.render(w, http.StatusOK, "index", d)
}

// read fills in what the page shows from the database.
func (p *pageHandler) read(ctx context.Context, d *indexData, window chartWindow) (err error) {
	// One count of the effects for both the totals and the destinations:
	// each reads every effect's index entry.
	if d.ByDest, err = query.CountEffectsByDestination(ctx, p.db.Read); err != nil {
		return err
	}
	var all query.Counts
	for _, bd := range d.ByDest {
		all = all.Plus(bd.Counts)
	}
	unknownCalls, err := query.CountUnknownCalls(ctx, p.db.Read)
	if err != nil {
		return err
	}
	d.Summary = EffectSummary{Counts: all, Total: all.Total(), UnknownCalls: unknownCalls}
	if d.Stuck, err = query.ListStuckEffects(ctx, p.db.Read, pageStuckLimit); err != nil {
		return err
	}
	if d.UnknownCalls, err = listPageUnknownCalls(ctx, p.db.Read, PageUnknownCalls); err != nil {
		return err
	}
	if d.Calls, err = query.RecentCalls(ctx, p.db.Read, pageCallsLimit); err != nil {
		return err
	}
	buckets, err := query.DeliveryHistory(ctx, p.db.Read, window.end(d.Now), window.Step, window.Buckets)
	if err != nil {
		return err
	}
	d.Chart = newChart(window, buckets)
	return nil
}

func (p *pageHandler) lookupCall(w http.ResponseWriter, r *http.Request) {
	res := &lookupResult{}
	form, err := readPageForm(w, r, "principal", "key")
	if err == nil {
		res.Principal, res.Key = strings.TrimSpace(form.Get("principal")), form.Get("key")
		err = p.findCall(r.Context(), res)
	}
	if err != nil {
		if !errors.As(err, new(BadInput)) {
			p.logger.Error("operator page lookup failed", "error", err)
		}
		res.Error = err.Error()
	}
	// The answer is rendered, not redirected to: a key in a URL would end
	// up in the browser's history and in proxies' logs, which this project
	// keeps keys out of.
	p.show(w, r, res)
}

// findCall looks up the call res names and fills in the rest of res.
func (p *pageHandler) findCall(ctx context.Context, res *lookupResult) error {
	// local, a token's principal (alice), or as the calls table stores it
	// (user:alice).
	principal := callkey.ParsePrincipal(res.Principal)
	if len(principal) > maxPagePrincipal || strings.ContainsFunc(principal, unicode.IsControl) {
		return badInputf("principal %q: want local, or a token's principal such as alice", Shorten(res.Principal, 40))
	}
	if res.Key == "" {
		return badInputf("give the call's idempotency key")
	}
	if err := callkey.Validate(res.Key); err != nil {
		return BadInput{err}
	}
	st, err := query.Lookup(ctx, p.db.Read, principal, res.Key, time.Now())
	if err != nil {
		return err
	}
	res.Status = st
	if len(st.Result) > 0 {
		var b bytes.Buffer
		if json.Indent(&b, st.Result, "", "  ") != nil {
			b.Reset()
			b.Write(st.Result)
		}
		res.Result = b.String()
		if utf8.RuneCountInString(res.Result) > pageResultLimit {
			res.Result = string([]rune(res.Result)[:pageResultLimit]) + "\n…"
		}
	}
	if st.CallID != "" {
		if res.EffectIDs, err = query.EffectIDs(ctx, p.db.Read, st.CallID); err != nil {
			return err
		}
	}
	return nil
}

func (p *pageHandler) action(a EffectAction) http.HandlerFunc {
	var fields []string
	if a.outcome {
		fields = []string{"outcome"}
	}
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := ParseEffectID(chi.URLParam(r, "id"))
		if err != nil {
			p.redirectFailed(w, r, a.name, err)
			return
		}
		form, err := readPageForm(w, r, fields...)
		if err != nil {
			p.redirectFailed(w, r, a.name, err)
			return
		}
		outcome := form.Get("outcome")
		res, err := ApplyEffectAction(r.Context(), p.db, a, id, outcome)
		if err != nil {
			p.redirectFailed(w, r, a.name, err)
			return
		}
		p.logger.Info("operator page action", "action", a.name, "outcome", outcome, "effect", id,
			"from", res.PreviousState, "to", res.Effect.State, "remote", r.RemoteAddr)
		msg := fmt.Sprintf("Effect %d (%s %s to %s): %s, now %s.", id, res.Effect.Method, Shorten(res.Effect.Path, 60),
			Shorten(res.Effect.Destination, 40), res.PreviousState, res.Effect.State)
		if res.Warning != "" {
			p.logger.Warn(res.Warning, "effect", id)
			msg += " Warning: " + res.Warning + "."
		}
		p.redirectFlash(w, r, flashDone, msg)
	}
}

func (p *pageHandler) retryDead(w http.ResponseWriter, r *http.Request) {
	if _, err := readPageForm(w, r); err != nil {
		p.redirectFailed(w, r, "retry-dead", err)
		return
	}
	n, err := admin.RetryDead(r.Context(), p.db)
	if err != nil {
		p.redirectFailed(w, r, "retry-dead", err)
		return
	}
	p.logger.Info("operator page action", "action", "retry-dead", "retried", n, "remote", r.RemoteAddr)
	p.redirectFlash(w, r, flashDone, fmt.Sprintf("Retried %d dead effects: they are pending, due now.", n))
}

func (p *pageHandler) redirectFailed(w http.ResponseWriter, r *http.Request, action string, err error) {
	var known *stateError
	if !errors.As(err, new(BadInput)) && !errors.As(err, &known) && !errors.Is(err, admin.ErrNoEffect) &&
		!errors.Is(err, admin.ErrNoCall) && !errors.Is(err, admin.ErrCallNotUnknown) {
		p.logger.Error("operator page action failed", "action", action, "error", err)
	}
	p.redirectFlash(w, r, flashFailed, fmt.Sprintf("%s refused: %v", action, err))
}

// Flash messages travel in the query string of the redirect after an
// action, signed with a key of this process.
const (
	flashDone   = "done"
	flashFailed = "failed"
)

type flash struct {
	Kind, Message string
}

func (p *pageHandler) flashSig(kind, msg string) string {
	m := hmac.New(sha256.New, p.flashKey)
	m.Write([]byte(kind + "\x00" + msg))
	return hex.EncodeToString(m.Sum(nil))
}

func (p *pageHandler) redirectFlash(w http.ResponseWriter, r *http.Request, kind, msg string) {
	msg = Shorten(msg, maxFlashLen)
	q := url.Values{kind: {msg}, "sig": {p.flashSig(kind, msg)}}
	http.Redirect(w, r, "/?"+q.Encode(), http.StatusSeeOther)
}

func (p *pageHandler) readFlash(q url.Values) *flash {
	for _, kind := range []string{flashDone, flashFailed} {
		msg := q.Get(kind)
		if msg != "" && hmac.Equal([]byte(q.Get("sig")), []byte(p.flashSig(kind, msg))) {
			return &flash{Kind: kind, Message: msg}
		}
	}
	return nil
}

func (p *pageHandler) errorPage(w http.ResponseWriter, status int, msg string) {
	p.render(w, status, "error", struct {
		Status  int
		Text    string
		Message string
	}{status, http.StatusText(status), msg})
}

// render executes a template into memory first, so that a failure half way
// through cannot send half a page with a 200.
func (p *pageHandler) render(w http.ResponseWriter, status int, name string, data any) {
	var b bytes.Buffer
	if err := pageTemplates.ExecuteTemplate(&b, name, data); err != nil {
		p.logger.Error("render operator page", "template", name, "error", err)
		http.Error(w, "render page: internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	// No script runs on the page; no other site may frame it (the buttons
	// act, so a framed page could be clicked through).
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	// Not no-referrer: under it a browser sends "Origin: null" with the
	// page's own form posts, which checkSameOrigin must refuse.
	h.Set("Referrer-Policy", "same-origin")
	w.WriteHeader(status)
	w.Write(b.Bytes())
}

// KeyHash is how the page and the logs name a call: callkey.KeyHash of its
// principal and key, never the key itself. A call without a key has none.
func KeyHash(principal, key string) string {
	if key == "" {
		return ""
	}
	return callkey.KeyHash(principal, key)
}

// chartWindow is a span the delivery chart can show.
type chartWindow struct {
	Name    string
	Label   string
	Step    time.Duration
	Buckets int
	tick    int // a tick label every tick buckets
	format  string
}

var chartWindows = []chartWindow{
	{Name: "1h", Label: "last hour, per minute", Step: time.Minute, Buckets: 60, tick: 10, format: "15:04"},
	{Name: "24h", Label: "last 24 hours, per hour", Step: time.Hour, Buckets: 24, tick: 4, format: "15:04"},
}

// end is the end of the last bucket: the next whole step after now, so
// that buckets fall on whole minutes or hours and now is in the last one.
func (cw chartWindow) end(now time.Time) time.Time { return now.Truncate(cw.Step).Add(cw.Step) }

// chart is the geometry of the delivery chart, drawn as inline SVG by the
// template: bars of deliveries with failures stacked on top.
type chart struct {
	Window          chartWindow
	Windows         []chartWindow
	Width, Height   int
	Left, Top       int // the plot area's top left corner
	PlotW, PlotH    int
	Bottom          int // y of the baseline
	Right, Middle   float64
	LabelX, TickY   float64
	TopLabelY       float64
	BottomLabelY    float64
	Max             int // the tallest bar: deliveries and failures of one bucket
	Bars            []chartBar
	Ticks           []chartTick
	Delivered, Fail int
}

type chartBar struct {
	X, W                     float64
	DeliveredY, DeliveredH   float64
	FailedY, FailedH         float64
	Label                    string
	Delivered, Failed, Empty bool
}

type chartTick struct {
	X     float64
	Label string
}

func newChart(cw chartWindow, buckets []query.Bucket) chart {
	c := chart{Window: cw, Windows: chartWindows, Width: 760, Height: 170, Left: 40, Top: 10, PlotW: 710, PlotH: 130}
	c.Bottom = c.Top + c.PlotH
	c.Right, c.Middle = float64(c.Left+c.PlotW), float64(c.Top)+float64(c.PlotH)/2
	c.LabelX, c.TopLabelY, c.BottomLabelY = float64(c.Left)-6, float64(c.Top)+4, float64(c.Bottom)+4
	c.TickY = float64(c.Bottom) + 18
	for _, b := range buckets {
		c.Max = max(c.Max, b.Delivered+b.Failed)
		c.Delivered += b.Delivered
		c.Fail += b.Failed
	}
	scaleMax := max(c.Max, 1)
	slot := float64(c.PlotW) / float64(len(buckets))
	for i, b := range buckets {
		x := float64(c.Left) + float64(i)*slot
		dh := float64(b.Delivered) / float64(scaleMax) * float64(c.PlotH)
		fh := float64(b.Failed) / float64(scaleMax) * float64(c.PlotH)
		bar := chartBar{X: x + slot*0.12, W: slot * 0.76, DeliveredH: dh, FailedH: fh,
			DeliveredY: float64(c.Bottom) - dh, FailedY: float64(c.Bottom) - dh - fh,
			Delivered: b.Delivered > 0, Failed: b.Failed > 0,
			Label: fmt.Sprintf("%s: %d delivered, %d failed", b.Start.Format("2006-01-02 15:04")+" UTC", b.Delivered, b.Failed)}
		c.Bars = append(c.Bars, bar)
		if i%cw.tick == 0 {
			c.Ticks = append(c.Ticks, chartTick{X: x, Label: b.Start.Format(cw.format)})
		}
	}
	return c
}

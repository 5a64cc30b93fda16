package operator

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/internal/opsquery"
	"github.com/mcp-outbox/mcp-outbox/internal/sealing"
	"github.com/mcp-outbox/mcp-outbox/internal/visible"
	"github.com/mcp-outbox/mcp-outbox/outbox/seal"
	"github.com/mcp-outbox/mcp-outbox/schema"
)

// The operator page: the state of the outbox at a glance and the operator
// actions of the admin API as buttons, server-rendered. It runs no script:
// every button is a form that POSTs, and the answer redirects back with a
// message. Paths are under Options.BasePath:
//
//	GET  /                          the page (page_index.go)
//	POST /lookup                    the page, with one call looked up by key
//	POST /effects/{id}/{action}     retry, cancel or resolve (form field outcome)
//	POST /effects/retry-dead        retry every dead effect
//	POST /effects/retarget          move a destination's pending effects (form
//	                                fields from, to; destinations.go)
//	POST /effects/cancel-pending    cancel a destination's pending effects
//	                                (form field destination)
//	POST /calls/{id}/resolve        settle an unknown call (page_calls.go)
//	GET  /login, POST /login        exchange the admin token for a session cookie
//	                                (page_login.go)
//	POST /logout                    end the session
//	GET  /static/page.css

//go:embed page
var pageFiles embed.FS

// pageTemplates are parsed once; each page handler clones them with its
// own base path (the "base" function).
var pageTemplates = template.Must(template.New("page").Funcs(template.FuncMap{
	"base":     func() string { return "/" },
	"keyHash":  operate.KeyHash,
	"utc":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"iso":      func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) },
	"ago":      func(t time.Time) string { return ago(time.Since(t)) },
	"took":     func(from, to time.Time) string { return tookText(to.Sub(from)) },
	"clip":     func(n int, s string) string { return operate.Shorten(s, n) },
	"px":       func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
	"ref":      func(id int64, state string) effectRef { return effectRef{id, state} },
	"needsOps": func(c opsquery.Counts) int { return c.Dead + c.Unknown },
}).ParseFS(pageFiles, "page/*.html"))

// Bounds of what the page shows and reads, so that it stays fast and
// legible however large the tables grow.
const (
	pageStuckLimit   = 50
	pageCallsLimit   = 20
	pageResultLimit  = 2000 // characters of a looked-up call's result
	maxFlashLen      = 500
	maxPagePrincipal = 256
)

// pageHandler serves the operator page for one database.
type pageHandler struct {
	db         *schema.DB
	sealer     *sealing.Sealer
	keys       seal.KeyRing // sealer's, for package query
	logger     *slog.Logger
	auth       *adminAuth // without an admin token: loopback only
	dispatcher Dispatcher
	base       string // Options.BasePath
	templates  *template.Template
	sessions   pageSessions
	now        func() time.Time
	// flashKey signs the messages that actions redirect with, so that a link
	// from elsewhere cannot make the page claim that something happened.
	flashKey []byte
}

// NewPage returns the operator page, at Options.BasePath. Its login
// sessions and flash messages are signed with Options.SessionKey, or with
// the key kept in the database, which NewPage reads (creating it on the
// first start) and logs where it is kept: every replica on one database
// accepts the sessions any of them issued.
//
// Without an admin token the page answers loopback clients only and needs
// no login; with one, /login trades the token for a session cookie (HMAC
// signed, 12 hours), and failed logins are limited per client address.
func NewPage(ctx context.Context, db *schema.DB, opts *Options) (http.Handler, error) {
	o, err := options(opts)
	if err != nil {
		return nil, err
	}
	p, err := newPageHandler(ctx, db, o)
	if err != nil {
		return nil, err
	}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	p.routes(r)
	return underBase(o.BasePath, r), nil
}

func newPageHandler(ctx context.Context, db *schema.DB, o Options) (*pageHandler, error) {
	key, where, created, err := loadSessionKey(ctx, db, o.SessionKey)
	if err != nil {
		return nil, fmt.Errorf("new operator page: %w", err)
	}
	o.Logger.Info("operator page session key", "kept_in", where, "created", created, "database", db.Path)
	tmpl := template.Must(pageTemplates.Clone())
	base := o.BasePath
	tmpl.Funcs(template.FuncMap{"base": func() string { return base }})
	return &pageHandler{db: db, sealer: sealing.Of(o.Keys), keys: o.Keys, logger: o.Logger, auth: newAdminAuth(o), dispatcher: o.Dispatcher, base: base,
		templates: tmpl, now: o.Now, flashKey: subkey(key, "flash"),
		sessions: pageSessions{key: subkey(key, "session"), adminHash: o.AdminTokenSHA256}}, nil
}

func (p *pageHandler) routes(r chi.Router) {
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
	r.Get("/", p.guard(accessRead, p.index))
	r.Post("/lookup", p.guard(accessRead, p.lookupCall))
	r.Post("/effects/retry-dead", p.guard(accessAct, p.retryDead))
	r.Post("/effects/retarget", p.guard(accessAct, p.retarget))
	r.Post("/effects/cancel-pending", p.guard(accessAct, p.cancelDestination))
	for _, a := range operate.EffectActions {
		r.Post("/effects/{id}/"+a.Name(), p.guard(accessAct, p.action(a)))
	}
	r.Post("/calls/{id}/resolve", p.guard(accessAct, p.resolveCall))
}

// guard applies the admin API's rule (adminAuth.check) to a page request,
// need saying whether it reads or acts, with a session cookie from /login
// accepted in place of the admin token, which a browser cannot send in a
// header. A browser without either is sent to the login form (GET) or
// refused (POST). Unsafe methods must come from the page's own origin.
func (p *pageHandler) guard(need access, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		by := bySession
		// A session stands for the admin token, so only while there is one.
		if !p.auth.tokenRequired() || !p.loggedIn(r) {
			var refused *operatorRefusal
			by, refused = p.auth.check(r, need)
			if refused != nil {
				if refused.noCredential && p.auth.tokenRequired() {
					if r.Method == http.MethodGet {
						http.Redirect(w, r, p.base+"login", http.StatusSeeOther)
						return
					}
					refused.msg = "Log in first: open " + p.base + "login and paste the admin token."
				}
				refused.writeHeader(w)
				p.errorPage(w, refused.status, refused.msg)
				return
			}
		}
		if r.Method != http.MethodGet {
			if err := checkSameOrigin(r); err != nil {
				p.errorPage(w, http.StatusForbidden, err.Error())
				return
			}
		}
		next(w, withOperator(r, by))
	}
}

// checkSameOrigin refuses a cross-origin form post (CSRF). The session
// cookie is SameSite=Strict, which keeps it off such requests in current
// browsers; this check does not depend on it. Sec-Fetch-Site is judged
// first (http.CrossOriginProtection, as the admin API does); an Origin
// header, when there is one, must name this host whatever Sec-Fetch-Site
// said.
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

// readPageForm reads a urlencoded form body holding at most the named
// fields, each at most once. A stray field is more likely a mistake than
// something to ignore, as in the admin API's bodies.
func readPageForm(w http.ResponseWriter, r *http.Request, fields ...string) (url.Values, error) {
	r.Body = http.MaxBytesReader(w, r.Body, operate.MaxPageForm)
	if err := r.ParseForm(); err != nil {
		return nil, operate.BadInputf("read form: %v", err)
	}
	for k, v := range r.PostForm {
		if !slices.Contains(fields, k) {
			return nil, operate.BadInputf("unexpected form field %q", k)
		}
		if len(v) > 1 {
			return nil, operate.BadInputf("form field %q given %d times", k, len(v))
		}
	}
	return r.PostForm, nil
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
	if err := p.templates.ExecuteTemplate(&b, name, data); err != nil {
		p.logger.Error("render operator page", "template", name, "error", err)
		http.Error(w, "render page: internal error", http.StatusInternalServerError)
		return
	}
	// Text from clients (a tool-call id, a principal, a tool's result, an
	// error) may hold format or control characters that would make the
	// page show something else than what is stored: shown as code points,
	// in every template at once.
	page := visible.HTML(b.Bytes())
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
	w.Write(page)
}

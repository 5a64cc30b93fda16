package operator

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
	"github.com/mcp-outbox/mcp-outbox/outbox/internal/clientaddr"
)

// The login of the page: the admin token traded for a signed session
// cookie (page_session.go), and a limit on failed logins per client.

const (
	// After operate.MaxLoginFailures wrong tokens from one client within
	// loginWindow of the first, its logins are refused with 429 until the
	// window ends, the token unchecked. At most maxLoginClients addresses
	// are tracked.
	loginWindow     = time.Minute
	maxLoginClients = 1000
)

func (p *pageHandler) loginForm(w http.ResponseWriter, r *http.Request) {
	if !p.auth.tokenRequired() || p.loggedIn(r) {
		http.Redirect(w, r, p.base, http.StatusSeeOther)
		return
	}
	p.render(w, http.StatusOK, "login", loginData{})
}

type loginData struct{ Error string }

func (p *pageHandler) login(w http.ResponseWriter, r *http.Request) {
	if !p.auth.tokenRequired() {
		http.Redirect(w, r, p.base, http.StatusSeeOther)
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
				"failures", operate.MaxLoginFailures, "for", loginWindow.String())
		}
		p.render(w, http.StatusUnauthorized, "login", loginData{Error: "That is not the admin token."})
		return
	}
	p.setSessionCookie(w, r, p.sessions.create(now), int(operate.PageSessionTTL.Seconds()))
	p.logger.Info("operator page login", "remote", r.RemoteAddr)
	http.Redirect(w, r, p.base, http.StatusSeeOther)
}

// loginClient is whom failed logins are counted against (clientaddr.Of).
func loginClient(r *http.Request) string { return clientaddr.Of(r.RemoteAddr) }

// loginLimiter counts failed logins per client in fixed windows: the first
// failure opens a window of loginWindow; operate.MaxLoginFailures in it close the
// login to that client until it ends. A successful login neither counts nor
// resets the count. The table is bounded: when full, ended windows go
// first, then the oldest.
//
// It is kept in this process's memory, not shared through the database,
// on purpose. With n replicas behind a balancer a guesser gets n times the
// attempts, but the admin token is a random 256-bit secret (mcp-outbox
// token): no rate of guessing finds it, so the limit's work is to keep a
// guesser from filling the log and burning CPU, which a per-process limit
// does on each process. Sharing it would cost a database write per failed
// login, made by unauthenticated clients: on SQLite, whose one writer also
// commits the tool calls, that turns a guesser into a brake on the server.
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
	if f.n < operate.MaxLoginFailures {
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
	return f.n == operate.MaxLoginFailures
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
	if err := p.endSession(r.Context(), r); err != nil {
		p.logger.Error("operator page logout failed", "error", err)
		p.errorPage(w, http.StatusInternalServerError, "Logging out failed, so the session still holds; the server's log has the error.")
		return
	}
	p.setSessionCookie(w, r, "", -1)
	target := p.base
	if p.auth.tokenRequired() {
		target = p.base + "login"
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

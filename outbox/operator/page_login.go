package operator

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
)

// The login of the page: the admin token traded for a signed session
// cookie (page_session.go). A wrong token counts against the client's
// limit on wrong admin tokens (adminAuth.guesses), shared with the header;
// the admin token, once accepted in either, is looked at past the limit.

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
	// The form is read before the limit is asked, which needs its token:
	// a read bounded by operate.MaxPageForm.
	form, err := readPageForm(w, r, "token")
	if err != nil {
		p.render(w, http.StatusBadRequest, "login", loginData{Error: err.Error()})
		return
	}
	token := form.Get("token")
	// The login guesses the admin token as the header does: one budget
	// (adminAuth.guesses) for both.
	if f := p.auth.tooManyGuesses(r, token); f != nil {
		w.Header().Set("Retry-After", strconv.Itoa(f.retryAfter))
		p.render(w, http.StatusTooManyRequests, "login", loginData{Error: fmt.Sprintf(
			"Too many failed logins from this address: wait %d seconds, then try again.", f.retryAfter)})
		return
	}
	if !p.auth.isAdminToken(token) {
		// Logged by the limiter, counted: a line per refusal would let a
		// guesser from many addresses fill the log.
		p.auth.guessed(r, token)
		p.render(w, http.StatusUnauthorized, "login", loginData{Error: "That is not the admin token."})
		return
	}
	p.auth.accepted(token, time.Time{})
	p.setSessionCookie(w, r, p.sessions.create(p.now()), int(operate.PageSessionTTL.Seconds()))
	p.logger.Info("operator page login", "remote", r.RemoteAddr)
	http.Redirect(w, r, p.base, http.StatusSeeOther)
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

package operator

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
)

// Login sessions of the page are signed cookies, so that a login on one
// replica holds on every other that shares the key (the database's, unless
// configured). The cookie is
//
//	v1.<expiry, unix seconds>.<session id>.<HMAC-SHA256>
//
// (id and MAC in base64url), signed with a key derived from the session
// key, over the version, the expiry, the id and the SHA-256 of the admin
// token: a new admin token ends every session, as a new session key does.
// Verifying needs no state; a logout, though, must end the session on
// every replica, not only drop the browser's copy (someone may have taken
// one), so it records the id in operator_logouts, which every guarded
// request checks. That is one indexed read per page request, which reads
// the database anyway, and a write only when an operator logs out.
const (
	pageCookie      = "mcp_outbox_session"
	sessionVersion  = "v1"
	sessionIDBytes  = 16
	sessionMACBytes = sha256.Size
)

// pageSessions signs and verifies session cookies.
type pageSessions struct {
	key       []byte // subkey(session key, "session")
	adminHash []byte
}

func (s pageSessions) mac(expiry, id string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(sessionVersion + "\x00" + expiry + "\x00" + id + "\x00"))
	m.Write(s.adminHash)
	return m.Sum(nil)
}

// create returns a new session cookie's value, valid until now plus the
// TTL.
func (s pageSessions) create(now time.Time) string {
	b := make([]byte, sessionIDBytes)
	rand.Read(b) // never fails (crypto/rand panics rather than return an error)
	id := base64.RawURLEncoding.EncodeToString(b)
	exp := strconv.FormatInt(now.Add(operate.PageSessionTTL).Unix(), 10)
	return sessionVersion + "." + exp + "." + id + "." + base64.RawURLEncoding.EncodeToString(s.mac(exp, id))
}

// verify reports whether v is a session this key signed that has not
// expired, with its id and expiry. The MAC is compared in constant time
// (hmac.Equal).
func (s pageSessions) verify(v string, now time.Time) (id string, expires time.Time, ok bool) {
	parts := strings.Split(v, ".")
	if len(parts) != 4 || parts[0] != sessionVersion {
		return "", time.Time{}, false
	}
	exp, id, sig := parts[1], parts[2], parts[3]
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(got) != sessionMACBytes || !hmac.Equal(got, s.mac(exp, id)) {
		return "", time.Time{}, false
	}
	n, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || !time.Unix(n, 0).After(now) {
		return "", time.Time{}, false
	}
	return id, time.Unix(n, 0), true
}

const (
	selectLogout = `SELECT COUNT(*) FROM operator_logouts WHERE session_id = $1`
	insertLogout = `INSERT INTO operator_logouts (session_id, expires_at) VALUES ($1, $2) ON CONFLICT (session_id) DO NOTHING`
	// The table holds only sessions that have not expired: each logout
	// sweeps the ones that have.
	deleteExpiredLogouts = `DELETE FROM operator_logouts WHERE expires_at <= $1`
)

// loggedIn reports whether r carries a valid session that no logout has
// ended. If the database cannot say, the answer is no: a login page is a
// smaller harm than a session that outlives its logout.
func (p *pageHandler) loggedIn(r *http.Request) bool {
	c, err := r.Cookie(pageCookie)
	if err != nil {
		return false
	}
	id, _, ok := p.sessions.verify(c.Value, p.now())
	if !ok {
		return false
	}
	var n int
	if err := p.db.Read.QueryRowContext(r.Context(), selectLogout, id).Scan(&n); err != nil {
		p.logger.Error("operator page: read logouts", "error", err)
		return false
	}
	return n == 0
}

// endSession records the logout of the session in r's cookie, if it has a
// valid one.
func (p *pageHandler) endSession(ctx context.Context, r *http.Request) error {
	c, err := r.Cookie(pageCookie)
	if err != nil {
		return nil
	}
	now := p.now()
	id, expires, ok := p.sessions.verify(c.Value, now)
	if !ok {
		return nil
	}
	if _, err := p.db.Write.ExecContext(ctx, deleteExpiredLogouts, now.UnixMilli()); err != nil {
		return fmt.Errorf("end session: %w", err)
	}
	if _, err := p.db.Write.ExecContext(ctx, insertLogout, id, expires.UnixMilli()); err != nil {
		return fmt.Errorf("end session: %w", err)
	}
	return nil
}

// setSessionCookie sets (or, with maxAge -1, clears) the session cookie
// for the page's base path. It is Secure when the browser reached us over
// TLS: directly, or through a proxy that terminates it and says so. Unlike
// X-Forwarded-For for the loopback rule, trusting that header is safe
// here: it can only keep the cookie off plain HTTP.
func (p *pageHandler) setSessionCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	secure := r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
	http.SetCookie(w, &http.Cookie{
		Name: pageCookie, Value: value, Path: p.base, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: secure,
	})
}

package operator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/mcp-outbox/mcp-outbox/outbox/bearer"
)

const testAdminToken = "test-admin-token"

func adminHash() []byte { h := sha256.Sum256([]byte(testAdminToken)); return h[:] }

// noRedirect is a client on a cookie jar that shows redirects instead of
// following them.
func noRedirect(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func do(t *testing.T, c *http.Client, method, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	var body *strings.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp, b.String()
}

// TestMountUnderPrefix: under /ops/, mounted three ways, every link, form
// action, redirect and the cookie's path stay under the prefix.
func TestMountUnderPrefix(t *testing.T) {
	t.Parallel()
	db := openTestDB(t)
	ctx := context.Background()
	opts := &Options{BasePath: "ops", AdminTokenSHA256: adminHash()} // slashes added
	h, err := NewHandler(ctx, db, opts)
	if err != nil {
		t.Fatal(err)
	}
	insertEffect(t, db, "payments", "dead")
	chiRouter := chi.NewRouter()
	chiRouter.Mount("/ops", h)
	for name, mount := range map[string]http.Handler{
		"ServeMux":    func() http.Handler { m := http.NewServeMux(); m.Handle("/ops/", h); return m }(),
		"StripPrefix": func() http.Handler { m := http.NewServeMux(); m.Handle("/ops/", http.StripPrefix("/ops", h)); return m }(),
		"chi.Mount":   chiRouter,
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(mount)
			defer srv.Close()
			c := noRedirect(t)
			resp, _ := do(t, c, http.MethodGet, srv.URL+"/ops/", nil)
			if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ops/login" {
				t.Fatalf("GET /ops/ logged out: %d to %q, want 303 to /ops/login", resp.StatusCode, resp.Header.Get("Location"))
			}
			resp, body := do(t, c, http.MethodGet, srv.URL+"/ops/login", nil)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, `action="/ops/login"`) || !strings.Contains(body, `href="/ops/static/page.css"`) {
				t.Fatalf("login form: %d\n%s", resp.StatusCode, body)
			}
			resp, _ = do(t, c, http.MethodPost, srv.URL+"/ops/login", url.Values{"token": {testAdminToken}})
			if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ops/" {
				t.Fatalf("login: %d to %q, want 303 to /ops/", resp.StatusCode, resp.Header.Get("Location"))
			}
			if cs := resp.Cookies(); len(cs) != 1 || cs[0].Path != "/ops/" || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode {
				t.Fatalf("session cookie %v: want one, Path=/ops/, HttpOnly, SameSite=Strict", cs)
			}
			resp, body = do(t, c, http.MethodGet, srv.URL+"/ops/", nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /ops/ logged in: %d\n%s", resp.StatusCode, body)
			}
			for _, m := range regexp.MustCompile(`(?:href|action)="([^"]*)"`).FindAllStringSubmatch(body, -1) {
				if !strings.HasPrefix(m[1], "/ops/") {
					t.Errorf("link or form %q is not under /ops/", m[1])
				}
			}
			if !strings.Contains(body, `action="/ops/effects/1/retry"`) || !strings.Contains(body, `action="/ops/logout"`) {
				t.Errorf("page lacks the effect's retry form or the logout form under /ops/")
			}
			resp, _ = do(t, c, http.MethodPost, srv.URL+"/ops/effects/1/cancel", url.Values{})
			loc := resp.Header.Get("Location")
			if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "/ops/?") {
				t.Fatalf("action: %d to %q, want 303 to /ops/?...", resp.StatusCode, loc)
			}
			if _, body := do(t, c, http.MethodGet, srv.URL+loc, nil); !strings.Contains(body, "Effect 1 (POST /v1/charges to payments): dead, now cancelled.") {
				t.Errorf("the flash after the action is missing:\n%s", grepLines(body, "flash"))
			}
			// Put it back for the next way of mounting.
			do(t, c, http.MethodPost, srv.URL+"/ops/effects/1/retry", url.Values{})
			if _, err := db.Write.Exec(`UPDATE effects SET state = 'dead' WHERE id = 1`); err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{"/ops/healthz", "/ops/readyz"} {
				if resp, _ := do(t, c, http.MethodGet, srv.URL+p, nil); resp.StatusCode != http.StatusOK {
					t.Errorf("GET %s: %d", p, resp.StatusCode)
				}
			}
			req, _ := http.NewRequest(http.MethodGet, srv.URL+"/ops/admin/summary", nil)
			req.Header.Set("Authorization", "Bearer "+testAdminToken)
			if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("GET /ops/admin/summary with the token: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
			req, _ = http.NewRequest(http.MethodGet, srv.URL+"/ops/metrics", nil)
			req.Header.Set("Authorization", "Bearer "+testAdminToken)
			if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("GET /ops/metrics with the token: %v %v", resp, err)
			} else {
				resp.Body.Close()
			}
			resp, _ = do(t, c, http.MethodPost, srv.URL+"/ops/logout", url.Values{})
			if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/ops/login" {
				t.Errorf("logout: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
			}
		})
	}
}

// TestPageReplicas: two pages on one database, as two replicas, with no
// key configured: the first start stores a key in the database, the second
// finds it, and a login or a flash message from one holds on the other. A
// page with another key accepts neither.
func TestPageReplicas(t *testing.T) {
	t.Parallel()
	db := openTestDB(t)
	ctx := context.Background()
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	newReplica := func(key []byte) *httptest.Server {
		t.Helper()
		h, err := NewPage(ctx, db, &Options{BasePath: "/ops/", AdminTokenSHA256: adminHash(), Logger: logger, SessionKey: key})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv
	}
	a := newReplica(nil)
	if !strings.Contains(logs.String(), `kept_in="database table operator_secret" created=true`) {
		t.Errorf("the first start does not log that it created the key in the database:\n%s", logs.String())
	}
	b := newReplica(nil)
	if !strings.Contains(logs.String(), `kept_in="database table operator_secret" created=false`) {
		t.Errorf("the second start does not log that it found the key:\n%s", logs.String())
	}
	insertEffect(t, db, "payments", "dead")

	c := noRedirect(t)
	resp, _ := do(t, c, http.MethodPost, a.URL+"/ops/login", url.Values{"token": {testAdminToken}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login on a: %d", resp.StatusCode)
	}
	session := resp.Cookies()[0]
	// The jar keys cookies by host; the replicas differ only by port, so it
	// sends a's cookie to b, as a browser does behind one balancer.
	resp, body := do(t, c, http.MethodGet, b.URL+"/ops/", nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `action="/ops/logout"`) {
		t.Fatalf("b after a login on a: %d to %q, want the page, logged in", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, _ = do(t, c, http.MethodPost, b.URL+"/ops/effects/1/cancel", url.Values{})
	if _, body := do(t, c, http.MethodGet, a.URL+resp.Header.Get("Location"), nil); !strings.Contains(body, "dead, now cancelled.") {
		t.Errorf("a does not show the flash that b set:\n%s", grepLines(body, "flash"))
	}

	// A logout on b ends the session on a too, even for a copy of the
	// cookie that the browser did not drop.
	resp, _ = do(t, c, http.MethodPost, b.URL+"/ops/logout", url.Values{})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout on b: %d", resp.StatusCode)
	}
	copied := noRedirect(t)
	req, _ := http.NewRequest(http.MethodGet, a.URL+"/ops/", nil)
	req.AddCookie(session)
	if resp, err := copied.Do(req); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a accepts a session that logged out on b: %d", resp.StatusCode)
	}

	other := newReplica(bytes.Repeat([]byte("k"), 32))
	resp, _ = do(t, c, http.MethodPost, a.URL+"/ops/login", url.Values{"token": {testAdminToken}})
	session = resp.Cookies()[0]
	req, _ = http.NewRequest(http.MethodGet, other.URL+"/ops/", nil)
	req.AddCookie(session)
	resp, err := noRedirect(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a page with another key accepts the session: %d", resp.StatusCode)
	}
	if _, err := NewPage(ctx, db, &Options{SessionKey: []byte("short")}); err == nil || !strings.Contains(err.Error(), "SessionKey has 5 bytes, want at least 32") {
		t.Errorf("a short key: %v", err)
	}
	// The hex of bearer.Hash as bytes: 64 of them, which would refuse the
	// right token as a wrong one.
	hexHash := []byte(bearer.Hash(testAdminToken))
	if _, err := NewHandler(ctx, db, &Options{AdminTokenSHA256: hexHash}); err == nil || !strings.Contains(err.Error(), "AdminTokenSHA256 has 64 bytes, want the 32 bytes") {
		t.Errorf("a hex admin hash: %v", err)
	}
	if _, err := NewPage(ctx, db, &Options{BasePath: "/ops?x"}); err == nil || !strings.Contains(err.Error(), `BasePath "/ops?x"`) {
		t.Errorf("a bad base path: %v", err)
	}
}

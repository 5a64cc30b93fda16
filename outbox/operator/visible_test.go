package operator

import (
	"context"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestOperatorViewsShowFormatCharacters: text from clients stored before
// the layer stripped format characters (a tool-call id with a
// right-to-left override, issue 37 point 5) is shown by the page as code
// points, and by the admin API as \u escapes; neither answer holds the
// override itself, which would make "x\u202egpj.exe" read "xexe.jpg".
func TestOperatorViewsShowFormatCharacters(t *testing.T) {
	t.Parallel()
	db := openTestDB(t)
	now := time.Now().UnixMilli()
	var callID int64
	if err := db.Write.QueryRow(`INSERT INTO calls (uid, principal, key, key_source, tool, args_hash, state, created_at, completed_at, expires_at, tool_call_id, result)
		VALUES ('call_0123456789abcdef01234567', 'local', 'old-row', 'meta', 'charge', 'h', 'completed', $1, $1, $2, $3, $4) RETURNING id`,
		now, now+time.Hour.Milliseconds(), "x\u202egpj.exe", "{\"content\":[{\"type\":\"text\",\"text\":\"paid \u2066invoice\u2069\"}]}").Scan(&callID); err != nil {
		t.Fatal(err)
	}
	var effectID int64
	if err := db.Write.QueryRow(`INSERT INTO effects (call_id, seq, destination, method, path, idempotency_key, state, next_attempt_at, created_at, updated_at)
		VALUES ($1, 1, 'payments', 'POST', $2, 'call_0123456789abcdef01234567-1', 'dead', 0, $3, $3) RETURNING id`,
		callID, "/v1/\u202efdp.exe", now).Scan(&effectID); err != nil {
		t.Fatal(err)
	}
	const override = "\u202e"

	page, err := NewPage(context.Background(), db, nil)
	if err != nil {
		t.Fatal(err)
	}
	form := url.Values{"principal": {"local"}, "key": {"old-row"}}
	req := httptest.NewRequest(http.MethodPost, "/lookup", strings.NewReader(form.Encode()))
	req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080"
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	page.ServeHTTP(rec, req)
	body := rec.Body.String()
	shown := html.UnescapeString(body) // as a browser draws it
	if rec.Code != http.StatusOK || !strings.Contains(shown, "x<U+202E>gpj.exe") ||
		!strings.Contains(shown, "paid <U+2066>invoice<U+2069>") || !strings.Contains(shown, "/v1/<U+202E>fdp.exe") {
		t.Errorf("lookup: %d, want the tool-call id, the result and the path with their format characters as code points:\n%s", rec.Code,
			grepLines(shown, "gpj")+grepLines(shown, "invoice")+grepLines(shown, "fdp"))
	}
	if strings.ContainsAny(body, override+"\u2066\u2069") {
		t.Errorf("the page holds a format character: %s", grepLines(body, override))
	}

	for _, path := range []string{"/effects/" + strconv.FormatInt(effectID, 10), "/effects?state=dead"} {
		code, got := getBody(t, NewAdmin(db, nil), path)
		if code != http.StatusOK || !strings.Contains(got, `/v1/\u202efdp.exe`) || strings.Contains(got, override) {
			t.Errorf("GET %s: %d %s, want the path's override as \\u202e", path, code, got)
		}
	}
}

func getBody(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr, req.Host = "127.0.0.1:50123", "127.0.0.1:8080"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

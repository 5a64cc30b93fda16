package operator

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"

	"github.com/mcp-outbox/mcp-outbox/internal/operate"
)

// Flash messages travel in the query string of the redirect after an
// action, signed (HMAC-SHA256) with a key derived from the session key, so
// that the replica that serves the redirect shows what another one did,
// and a link from elsewhere cannot make the page claim that something
// happened. A message never holds a key (calls are named by row id and key
// hash), so it may sit in the browser's history.
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
	msg = operate.Shorten(msg, maxFlashLen)
	q := url.Values{kind: {msg}, "sig": {p.flashSig(kind, msg)}}
	http.Redirect(w, r, p.base+"?"+q.Encode(), http.StatusSeeOther)
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

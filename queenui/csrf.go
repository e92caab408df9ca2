package queenui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
)

// csrf issues and checks form tokens: the token is an HMAC, under a secret
// drawn when the handler is made, of a random nonce kept in a SameSite
// cookie. A forged form has no token for the victim's cookie, and a token
// from another handler (or before a restart) does not verify.
type csrf struct {
	secret [32]byte
}

const csrfCookie = "queenui_csrf"

func newCSRF() *csrf {
	c := &csrf{}
	_, _ = rand.Read(c.secret[:]) // never fails
	return c
}

func (c *csrf) mac(nonce string) string {
	m := hmac.New(sha256.New, c.secret[:])
	m.Write([]byte(nonce))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// token returns the form token for r's nonce, setting the cookie when r
// has none.
func (c *csrf) token(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 43 {
		return c.mac(ck.Value)
	}
	var b [32]byte
	_, _ = rand.Read(b[:])
	nonce := base64.RawURLEncoding.EncodeToString(b[:])
	// No Path: it defaults to the directory of the page, so the cookie is
	// this dashboard's wherever it is mounted.
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: nonce, HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil})
	return c.mac(nonce)
}

func (c *csrf) valid(r *http.Request, token string) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || ck.Value == "" || token == "" {
		return false
	}
	return hmac.Equal([]byte(token), []byte(c.mac(ck.Value)))
}

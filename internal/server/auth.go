package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/checkapi"
	"github.com/sluicehq/sluice/internal/config"
)

// Token is a bearer token the check API accepts, and what it may do.
type Token struct {
	// ID names the token in the request log; the secret is never logged.
	ID string
	// Secret is what a client sends as "Authorization: Bearer <secret>";
	// at least config.MinTokenLen bytes.
	Secret []byte
	// Scopes are config.ScopeCheck (spend and peek), config.ScopeRefund
	// (give units back) and config.ScopeReset (clear a subject's state).
	Scopes []string
}

// auth checks bearer tokens. Presented tokens are compared as SHA-256
// digests in constant time against every configured token, so neither
// the comparison nor the number of tokens tried leaks a secret's prefix.
type auth struct {
	tokens []authToken
}

type authToken struct {
	id     string
	digest [sha256.Size]byte
	scopes []string
}

func newAuth(tokens []Token) (*auth, error) {
	if len(tokens) == 0 {
		return nil, nil
	}
	a := &auth{}
	seen := map[[sha256.Size]byte]string{}
	for i, t := range tokens {
		switch {
		case t.ID == "":
			return nil, fmt.Errorf("server: New: Tokens[%d].ID is empty", i)
		case len(t.Secret) < config.MinTokenLen:
			return nil, fmt.Errorf("server: New: Tokens[%d] (%s): secret is %d bytes: must be at least %d", i, t.ID, len(t.Secret), config.MinTokenLen)
		case len(t.Scopes) == 0:
			return nil, fmt.Errorf("server: New: Tokens[%d] (%s): no scopes: want one of %s", i, t.ID, config.Scopes)
		}
		for _, sc := range t.Scopes {
			if !config.ValidScope(sc) {
				return nil, fmt.Errorf("server: New: Tokens[%d] (%s): scope %q: must be one of %s", i, t.ID, sc, config.Scopes)
			}
		}
		d := sha256.Sum256(t.Secret)
		if other, dup := seen[d]; dup {
			return nil, fmt.Errorf("server: New: Tokens[%d] (%s): same secret as token %s", i, t.ID, other)
		}
		seen[d] = t.ID
		a.tokens = append(a.tokens, authToken{id: t.ID, digest: d, scopes: slices.Clone(t.Scopes)})
	}
	return a, nil
}

var errUnauthenticated = errors.New("a valid bearer token is required: Authorization: Bearer <token>")

// authenticate returns the token an Authorization value presents (an
// HTTP header's, gRPC metadata's), or errUnauthenticated.
func (a *auth) authenticate(authorization string) (*authToken, error) {
	scheme, secret, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil, errUnauthenticated
	}
	d := sha256.Sum256([]byte(strings.TrimSpace(secret)))
	var found *authToken
	for i := range a.tokens {
		if subtle.ConstantTimeCompare(d[:], a.tokens[i].digest[:]) == 1 {
			found = &a.tokens[i]
		}
	}
	if found == nil {
		return nil, errUnauthenticated
	}
	return found, nil
}

// authenticated returns the request's token when tokens are configured
// (nil when they are not) and whether the request may go on; a missing or
// unknown token is answered 401 here.
func (s *Server) authenticated(w http.ResponseWriter, r *http.Request, in *checkapi.Request) (*authToken, bool) {
	if s.auth == nil {
		return nil, true
	}
	lw, _ := w.(*logWriter)
	tok, err := s.auth.authenticate(r.Header.Get("Authorization"))
	if err != nil {
		if lw != nil {
			lw.reason = err.Error()
		}
		s.refuse(w, in, nil, "")
		return nil, false
	}
	if lw != nil {
		lw.token = tok.id
	}
	return tok, true
}

// permits reports whether tok, the request's token (nil without tokens
// configured), allows scope; when it does not the request is answered 403
// here.
func (s *Server) permits(w http.ResponseWriter, in *checkapi.Request, tok *authToken, scope string) bool {
	if tok == nil || slices.Contains(tok.scopes, scope) {
		return true
	}
	if lw, ok := w.(*logWriter); ok {
		lw.reason = "token lacks scope " + scope
	}
	s.refuse(w, in, tok, scope)
	return false
}

// refuse answers a request the token does not allow: 401 with a
// challenge when there is no valid token, 403 naming the missing scope.
func (s *Server) refuse(w http.ResponseWriter, in *checkapi.Request, tok *authToken, scope string) {
	h := w.Header()
	if tok == nil {
		h.Set("WWW-Authenticate", `Bearer realm="sluice"`)
		s.answer(w, in, http.StatusUnauthorized, sluice.Outcome{Kind: sluice.Incompatible}, errUnauthenticated.Error())
		return
	}
	h.Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="sluice", error="insufficient_scope", scope=%q`, scope))
	s.answer(w, in, http.StatusForbidden, sluice.Outcome{Kind: sluice.Incompatible}, lacksScope(tok, scope))
}

// lacksScope is the reason of a 403: tok lacks scope.
func lacksScope(tok *authToken, scope string) string {
	return fmt.Sprintf("token %q lacks scope %s", tok.id, scope)
}

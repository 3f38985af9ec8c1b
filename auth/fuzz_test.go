package auth

import (
	"errors"
	"strings"
	"testing"
)

// FuzzBearerToken feeds arbitrary authorization values through everything
// that reads a token before the API server sees it: ParseBearer and the
// unverified claims. Neither may panic; their errors are
// ErrUnauthenticated, short, and never quote the token.
func FuzzBearerToken(f *testing.F) {
	f.Add("Bearer " + jwt(map[string]any{"exp": 1, "aud": "informerd"}))
	f.Add("Bearer " + jwt(map[string]any{"aud": []string{"a", "b"}, "kubernetes.io": map[string]any{"namespace": "n", "pod": nil}}))
	f.Add("bearer a.b.c")
	f.Add("Bearer ..")
	f.Add("Basic x")
	f.Add("Bearer eyJhbGciOiJub25lIn0.eyJhdWQiOnt9fQ.x")
	f.Fuzz(func(t *testing.T, value string) {
		token, err := ParseBearer([]string{value})
		if err != nil {
			if !errors.Is(err, ErrUnauthenticated) || len(err.Error()) > 200 {
				t.Fatalf("ParseBearer error %q", err)
			}
			return
		}
		if token == "" || len(token) > MaxTokenBytes || strings.TrimSpace(token) != token {
			t.Fatalf("ParseBearer returned token %q", token)
		}
		c, err := parseClaims(token)
		if err != nil {
			if len(token) > 8 && strings.Contains(err.Error(), token) {
				t.Fatalf("parseClaims quotes the token: %v", err)
			}
			return
		}
		_ = c.expiry()
		_ = c.serviceAccount()
	})
}

package auth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// jwt returns an unsigned token with claims, shaped like a JWT.
func jwt(claims map[string]any) string {
	part := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return part(map[string]string{"alg": "RS256", "kid": "test"}) + "." + part(claims) + ".c2lnbmF0dXJl"
}

func TestParseBearer(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   string // the token, or "" for an error
		msg    string // in the error
	}{
		{"none", nil, "", "no token"},
		{"two", []string{"Bearer a", "Bearer b"}, "", "2 authorization values"},
		{"basic", []string{"Basic dXNlcjpwYXNz"}, "", `want "Bearer <token>"`},
		{"short", []string{"Bear"}, "", `want "Bearer <token>"`},
		{"empty", []string{"Bearer   "}, "", "empty"},
		{"huge", []string{"Bearer " + strings.Repeat("a", MaxTokenBytes+1)}, "", "at most 8192"},
		{"ok", []string{"Bearer abc.def.ghi"}, "abc.def.ghi", ""},
		{"lower case scheme", []string{"bearer abc"}, "abc", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBearer(tt.values)
			if tt.want != "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseBearer = %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("ParseBearer error = %v, want ErrUnauthenticated mentioning %q", err, tt.msg)
			}
			if strings.Contains(err.Error(), "dXNlcjpwYXNz") {
				t.Fatalf("the error quotes the credential: %v", err)
			}
		})
	}
}

func TestParseClaims(t *testing.T) {
	sa := jwt(map[string]any{
		"exp": 1700000000, "aud": []string{"informerd", "other"}, "sub": "system:serviceaccount:a:reader",
		"kubernetes.io": map[string]any{
			"namespace": "a", "serviceaccount": map[string]string{"name": "reader", "uid": "u1"},
			"pod": map[string]string{"name": "p", "uid": "u2"}, "node": map[string]string{"name": "n1", "uid": "u3"},
		},
	})
	c, err := parseClaims(sa)
	if err != nil {
		t.Fatal(err)
	}
	if c.Expiry != 1700000000 || len(c.Audience) != 2 || c.serviceAccount() != "a/reader" || c.K8s.Node.Name != "n1" || c.K8s.Pod.Name != "p" {
		t.Fatalf("claims = %+v", c)
	}
	if c, err := parseClaims(jwt(map[string]any{"aud": "informerd"})); err != nil || len(c.Audience) != 1 || c.Audience[0] != "informerd" || !c.expiry().IsZero() {
		t.Fatalf("single audience: %+v, %v", c, err)
	}
	for name, token := range map[string]string{
		"two parts":       "abc.def",
		"not base64":      "!!!.???.sig",
		"header not JSON": base64.RawURLEncoding.EncodeToString([]byte("nope")) + ".e30.sig",
		"no alg":          "e30.e30.sig",
		"aud a number":    jwt(map[string]any{"aud": 5}),
		"no signature":    strings.TrimSuffix(jwt(map[string]any{}), "c2lnbmF0dXJl"),
	} {
		if _, err := parseClaims(token); err == nil || !strings.HasPrefix(err.Error(), "not a JWT") {
			t.Errorf("%s: error = %v, want one starting with \"not a JWT\"", name, err)
		}
	}
}

package auth

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"
)

// MaxTokenBytes bounds a bearer token. A projected ServiceAccount token is
// about 1 KiB; a pod-bound one a little more.
const MaxTokenBytes = 8 << 10

// errNoToken is what ParseBearer returns for no authorization at all; the
// Authenticator explains it with its audience.
var errNoToken = errorf(ErrUnauthenticated, "no token")

// ParseBearer returns the token of the values of an authorization header
// (gRPC metadata or HTTP): exactly one value, "Bearer <token>". Errors wrap
// ErrUnauthenticated and never quote what was sent, which may be a secret.
func ParseBearer(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", errNoToken
	case 1:
	default:
		return "", errorf(ErrUnauthenticated, "%d authorization values: send exactly one, \"Bearer <token>\"", len(values))
	}
	v := values[0]
	const prefix = "bearer "
	if len(v) < len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return "", errorf(ErrUnauthenticated, "malformed authorization: want \"Bearer <token>\"")
	}
	token := strings.TrimSpace(v[len(prefix):])
	switch {
	case token == "":
		return "", errorf(ErrUnauthenticated, "malformed authorization: the bearer token is empty")
	case len(token) > MaxTokenBytes:
		return "", errorf(ErrUnauthenticated, "malformed token: %d bytes, at most %d are accepted", len(token), MaxTokenBytes)
	}
	return token, nil
}

// claims are the parts of a token's JWT claims that explain a decision.
// They are read without verifying the signature: they never decide
// anything alone.
type claims struct {
	Expiry   int64     `json:"exp"`
	Audience audiences `json:"aud"`
	Subject  string    `json:"sub"`
	K8s      *struct {
		Namespace      string `json:"namespace"`
		ServiceAccount *ref   `json:"serviceaccount"`
		Pod            *ref   `json:"pod"`
		Node           *ref   `json:"node"`
	} `json:"kubernetes.io"`
}

type ref struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// audiences is a JWT "aud": one string or a list.
type audiences []string

func (a *audiences) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*a = audiences{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New(`"aud" is neither a string nor a list of strings`)
	}
	*a = many
	return nil
}

// expiry returns the token's expiry, or the zero time if it has none.
func (c claims) expiry() time.Time {
	if c.Expiry <= 0 {
		return time.Time{}
	}
	return time.Unix(c.Expiry, 0)
}

// serviceAccount returns "namespace/name" of the token's ServiceAccount,
// or "".
func (c claims) serviceAccount() string {
	if c.K8s == nil || c.K8s.ServiceAccount == nil {
		return ""
	}
	return c.K8s.Namespace + "/" + c.K8s.ServiceAccount.Name
}

// parseClaims reads a JWT's claims without verifying it. The error says
// what is wrong in terms of the JWT's shape, never quoting the token.
func parseClaims(token string) (claims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return claims{}, errors.New("not a JWT: want three dot-separated base64url parts")
	}
	var header struct {
		Alg string `json:"alg"`
	}
	if err := decodePart(parts[0], &header); err != nil || header.Alg == "" {
		return claims{}, errors.New("not a JWT: its header is not base64url JSON with an \"alg\"")
	}
	var c claims
	if err := decodePart(parts[1], &c); err != nil {
		return claims{}, errors.New("not a JWT: its claims are not base64url JSON of the expected types")
	}
	if parts[2] == "" {
		return claims{}, errors.New("not a JWT: it has no signature")
	}
	return c, nil
}

func decodePart(part string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(part, "="))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// tokenKey is the cache key of a token: its SHA-256, so that no cache
// holds a usable token.
type tokenKey [sha256.Size]byte

func keyOf(token string) tokenKey { return sha256.Sum256([]byte(token)) }

package auth

import "time"

// Remembered is what an Authenticator and an Authorizer verified and have
// not yet forgotten, for a hot handoff to the daemon that replaces this one
// on the node (cmd/informerd): the new daemon answers the callers this one
// answered, as this one would have and for no longer, even while the API
// server is unreachable. It holds no token, only tokens' SHA-256, and no
// denial: a question the new daemon cannot answer from it costs a review,
// as any new question does.
type Remembered struct {
	// Audience and NodeName are the Authenticator's: tokens verified for
	// another audience or node are not remembered by an Authenticator of
	// this one.
	Audience string `json:"audience"`
	NodeName string `json:"nodeName,omitempty"`
	// Tokens are the tokens verified, oldest first.
	Tokens []RememberedToken `json:"tokens,omitempty"`
	// Allowed are the accesses allowed, oldest first.
	Allowed []RememberedAccess `json:"allowed,omitempty"`
	// Graced are the callers whose streams are served through an outage:
	// their Grants' re-checks fail because the API server is unreachable.
	Graced []RememberedGrace `json:"graced,omitempty"`
}

// RememberedGrace is a caller served on through an API server outage, for
// the grace after its stream's re-checks started failing (see Grant): its
// token's SHA-256 and user, its accesses' keys, and when the grace ends.
// The daemon that imports it answers the token and the accesses from it
// until then, and only while it cannot ask the API server.
type RememberedGrace struct {
	TokenKey []byte    `json:"tokenKey"`
	User     *User     `json:"user"`
	Accesses [][]byte  `json:"accesses,omitempty"`
	Until    time.Time `json:"until"`
}

// RememberedToken is a verified token: the SHA-256 of the token, its
// caller, and when the verification expires.
type RememberedToken struct {
	Key     []byte    `json:"key"`
	User    *User     `json:"user"`
	Expires time.Time `json:"expires"`
}

// RememberedAccess is an allowed access: the key of the user and the
// attributes (keyOfAccess), and when the decision expires.
type RememberedAccess struct {
	Key     []byte    `json:"key"`
	Expires time.Time `json:"expires"`
}

// Export returns what a and z remember that has not expired. Either may be
// nil.
func Export(a *Authenticator, z *Authorizer) Remembered {
	var r Remembered
	if a != nil {
		r.Audience, r.NodeName = a.opts.Audience, a.opts.NodeName
		now := a.opts.Now()
		for _, k := range a.cache.Keys() {
			if e, ok := a.cache.Peek(k); ok && e.user != nil && e.err == nil && now.Before(e.expires) {
				r.Tokens = append(r.Tokens, RememberedToken{Key: k[:], User: e.user, Expires: e.expires})
			}
		}
	}
	if z != nil {
		now := z.opts.Now()
		for _, k := range z.allowed.Keys() {
			if exp, ok := z.allowed.Peek(k); ok && now.Before(exp) {
				r.Allowed = append(r.Allowed, RememberedAccess{Key: k[:], Expires: exp})
			}
		}
	}
	if a != nil {
		for _, g := range a.liveGrants() {
			token, u, accesses, until, ok := g.graced()
			if !ok || !a.opts.Now().Before(until) {
				continue
			}
			key := keyOf(token)
			rg := RememberedGrace{TokenKey: key[:], User: u, Until: until}
			for _, at := range accesses {
				k := keyOfAccess(u, at)
				rg.Accesses = append(rg.Accesses, k[:])
			}
			r.Graced = append(r.Graced, rg)
		}
	}
	return r
}

// Import makes a and z (either may be nil) remember what r holds, as
// another daemon's Export returned it, and reports how many tokens and
// accesses they took. It never widens what a caller may do: each entry
// keeps its expiry, shortened to this one's CacheTTL or AllowTTL; tokens
// verified for another audience or node are left out, and entries that
// expired or are malformed too. A caller served through an outage (Graced)
// is answered, while the API server cannot be asked only, until its grace
// on the other daemon ends, cut to this one's grace (AllowTTL) from now;
// it is counted among the tokens, its accesses among the accesses.
func Import(r Remembered, a *Authenticator, z *Authorizer) (tokens, allowed int) {
	sameCaller := a != nil && r.Audience == a.opts.Audience && r.NodeName == a.opts.NodeName
	if sameCaller && z != nil {
		now := z.opts.Now()
		for _, g := range r.Graced {
			var k tokenKey
			if len(g.TokenKey) != len(k) || g.User == nil || g.User.Name == "" {
				continue
			}
			until := g.Until
			if limit := now.Add(z.opts.AllowTTL); until.After(limit) {
				until = limit
			}
			if !now.Before(until) {
				continue
			}
			copy(k[:], g.TokenKey)
			if !a.carried.put(k, g.User, until, a.opts.CacheSize) {
				continue
			}
			tokens++
			for _, ak := range g.Accesses {
				var k accessKey
				if len(ak) != len(k) {
					continue
				}
				copy(k[:], ak)
				if z.carried.put(k, struct{}{}, until, z.opts.CacheSize) {
					allowed++
				}
			}
		}
	}
	if sameCaller {
		now := a.opts.Now()
		for _, t := range r.Tokens {
			var k tokenKey
			if len(t.Key) != len(k) || t.User == nil || t.User.Name == "" {
				continue
			}
			exp := t.Expires
			if limit := now.Add(a.opts.CacheTTL); exp.After(limit) {
				exp = limit
			}
			if !now.Before(exp) {
				continue
			}
			copy(k[:], t.Key)
			a.cache.Add(k, tokenEntry{user: t.User, expires: exp})
			tokens++
		}
	}
	if z != nil {
		now := z.opts.Now()
		for _, d := range r.Allowed {
			var k accessKey
			if len(d.Key) != len(k) {
				continue
			}
			exp := d.Expires
			if limit := now.Add(z.opts.AllowTTL); exp.After(limit) {
				exp = limit
			}
			if !now.Before(exp) {
				continue
			}
			copy(k[:], d.Key)
			z.allowed.Add(k, exp)
			allowed++
		}
	}
	return tokens, allowed
}

package daemon

import (
	"container/list"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/informerd/informerd/auth"
)

// Listen wraps l for the Server: it records each connection's peer (the
// SO_PEERCRED credentials of a Unix socket peer, the IP of a TCP peer;
// auth.Peer.Key is the peer its limits count) and bounds the connections:
//
//   - a new connection beyond MaxConnectionsPerPeer of its peer is closed
//     at once;
//   - a connection is unauthenticated until a call on it passes
//     authentication (a token-less health Check does not); one that has
//     not within ConnectionTimeout of its accept is closed;
//   - when MaxConnections are open, or MaxUnauthenticatedConnections are
//     unauthenticated, a new connection displaces the oldest
//     unauthenticated connection of the peer that has the most (the new
//     one counted), so that strangers cannot keep callers out; with none
//     unauthenticated, the new connection is closed at once.
//
// Serve the grpc.Server on what it returns.
func (s *Server) Listen(l net.Listener) net.Listener { return &limitListener{Listener: l, s: s} }

type limitListener struct {
	net.Listener
	s *Server
}

// Accept returns the next connection within the limits, closing those
// beyond them and those it displaces.
func (l *limitListener) Accept() (net.Conn, error) {
	lim := l.s.opts.Limits
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		p := auth.PeerOf(c)
		pc := &peerConn{Conn: c, key: p.Key(), counter: l.s.conns}
		pc.addr = peerAddr{Addr: c.RemoteAddr(), peer: p, conn: pc}
		displaced, refused := l.s.conns.admit(pc, lim.MaxUnauthenticatedConnections, lim.ConnectionTimeout, l.s.closeUnauthenticated)
		if refused != "" {
			l.s.metrics.limited.WithLabelValues(refused).Inc()
			l.s.log.Debug("connection refused", "peer", p.String(), "limit", refused)
			_ = c.Close()
			continue
		}
		if displaced != nil {
			l.s.closeUnauthenticated(displaced, "displaced by a new connection")
		}
		return pc, nil
	}
}

// closeUnauthenticated closes c, whose slots admit or its timer already
// gave back, and counts it.
func (s *Server) closeUnauthenticated(c *peerConn, why string) {
	s.metrics.limited.WithLabelValues(unauthenticatedLimit).Inc()
	s.log.Debug("unauthenticated connection closed", "peer", c.addr.peer.String(), "reason", why)
	_ = c.Conn.Close()
}

// unauthenticatedLimit is the limit label of connections closed before a
// call on them passed authentication.
const unauthenticatedLimit = "unauthenticated_connections"

// authenticated records that a call on ctx's connection passed
// authentication: from now on the connection no longer counts as
// unauthenticated and its ConnectionTimeout no longer applies. Calling it
// again, or for a connection already closed, does nothing.
func (k *connCounter) authenticated(ctx context.Context) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return
	}
	a, ok := p.Addr.(peerAddr)
	if !ok || a.conn == nil || a.conn.authenticated.Load() { // every later call: no lock
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if a.conn.state == connPending {
		k.unpend(a.conn)
		a.conn.state = connAuthenticated
	}
	a.conn.authenticated.Store(true)
}

// peerConn is an accepted connection that knows its peer and gives its
// slots back when closed.
type peerConn struct {
	net.Conn
	addr    peerAddr
	key     string // addr.peer.Key(): what the limits count
	counter *connCounter

	// state, pending, seq and timer are guarded by counter.mu.
	state connState
	// pending is its place in its peer's unauthenticated connections.
	pending *list.Element
	// seq orders connections by accept, across peers.
	seq uint64
	// timer closes the connection if still pending at ConnectionTimeout.
	timer *time.Timer
	// authenticated is set once a call on it passed authentication, so
	// that later calls need not take counter.mu.
	authenticated atomic.Bool
}

// connState is where a connection is in its life, for the limits.
type connState int

const (
	// connUncounted: it holds no slots, not admitted or given back.
	connUncounted connState = iota
	// connPending: no call on it has passed authentication yet.
	connPending
	connAuthenticated
)

// RemoteAddr returns the peer, which gRPC hands to handlers as peer.Addr.
func (c *peerConn) RemoteAddr() net.Addr { return c.addr }

// Close closes the connection and gives its slots back, once.
func (c *peerConn) Close() error {
	err := c.Conn.Close()
	c.counter.mu.Lock()
	c.counter.drop(c)
	c.counter.mu.Unlock()
	return err
}

// peerAddr is a connection's address with what the daemon learned of its
// peer when it connected, and the connection, so that a call that passes
// authentication can mark it.
type peerAddr struct {
	net.Addr
	peer auth.Peer
	conn *peerConn
}

func (a peerAddr) String() string { return a.peer.String() }

// connCounter counts open connections, in all, per peer and those not yet
// authenticated, and chooses which unauthenticated connection gives way to
// a new one.
type connCounter struct {
	max, perPeer int

	mu     sync.Mutex // guards total, byPeer, pending, npending, seq and every peerConn's state, pending, seq and timer
	total  int
	byPeer map[string]int
	// pending holds each peer's unauthenticated connections, oldest first.
	pending  map[string]*list.List
	npending int
	seq      uint64
}

// admit takes slots for c, which starts unauthenticated, and arms its
// timer, which closes it with closeFn unless it authenticates within
// timeout. It returns the connection c displaced (its slots already given
// back: the caller closes it), or the name of the limit that refuses c.
// maxPending bounds the unauthenticated connections.
func (k *connCounter) admit(c *peerConn, maxPending int, timeout time.Duration, closeFn func(*peerConn, string)) (displaced *peerConn, refused string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.byPeer[c.key] >= k.perPeer {
		return nil, "connections_per_peer"
	}
	if k.total >= k.max || k.npending >= maxPending {
		if displaced = k.oldestOfLargest(c.key); displaced == nil {
			return nil, "connections"
		}
		k.drop(displaced)
	}
	k.total++
	k.byPeer[c.key]++
	if k.pending == nil {
		k.pending = map[string]*list.List{}
	}
	l := k.pending[c.key]
	if l == nil {
		l = list.New()
		k.pending[c.key] = l
	}
	k.seq++
	c.state, c.pending, c.seq = connPending, l.PushBack(c), k.seq
	k.npending++
	c.timer = time.AfterFunc(timeout, func() {
		k.mu.Lock()
		expired := c.state == connPending
		if expired {
			k.drop(c)
		}
		k.mu.Unlock()
		if expired {
			closeFn(c, "not authenticated within the connection timeout")
		}
	})
	return displaced, ""
}

// oldestOfLargest returns the oldest unauthenticated connection of the
// peer with the most, counting a new connection of peer newcomer; of
// peers with as many, the one with the oldest. Nil if there is none.
func (k *connCounter) oldestOfLargest(newcomer string) *peerConn {
	var (
		oldest *peerConn
		most   int
	)
	for p, l := range k.pending {
		n := l.Len()
		if p == newcomer {
			n++
		}
		first := l.Front().Value.(*peerConn)
		if n > most || (n == most && first.seq < oldest.seq) {
			oldest, most = first, n
		}
	}
	return oldest
}

// drop gives c's slots back and stops its timer, unless it holds none.
// k.mu must be held.
func (k *connCounter) drop(c *peerConn) {
	if c.state == connUncounted {
		return
	}
	if c.state == connPending {
		k.unpend(c)
	}
	c.state = connUncounted
	k.total--
	if k.byPeer[c.key]--; k.byPeer[c.key] <= 0 {
		delete(k.byPeer, c.key)
	}
}

// unpend removes pending c from the unauthenticated connections and stops
// its timer. k.mu must be held.
func (k *connCounter) unpend(c *peerConn) {
	c.timer.Stop()
	l := k.pending[c.key]
	l.Remove(c.pending)
	c.pending = nil
	if l.Len() == 0 {
		delete(k.pending, c.key)
	}
	k.npending--
}

// transportCreds serve TCP connections with TLS, if configured, and Unix
// socket connections (whose peer the kernel vouches for) in the clear.
type transportCreds struct {
	tls credentials.TransportCredentials // nil: no TLS at all
}

type plainInfo struct{ credentials.CommonAuthInfo }

func (plainInfo) AuthType() string { return "insecure" }

func (c transportCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if c.tls == nil || conn.LocalAddr().Network() == "unix" {
		return conn, plainInfo{credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
	}
	return c.tls.ServerHandshake(conn)
}

func (transportCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("informerd's transport credentials are server-side only")
}

func (c transportCreds) Info() credentials.ProtocolInfo {
	if c.tls != nil {
		return c.tls.Info()
	}
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (c transportCreds) Clone() credentials.TransportCredentials {
	if c.tls != nil {
		return transportCreds{tls: c.tls.Clone()}
	}
	return c
}

func (transportCreds) OverrideServerName(string) error { return nil }

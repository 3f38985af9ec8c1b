package daemon

import (
	"context"
	"errors"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"

	"github.com/informerd/informerd/auth"
)

// Listen wraps l for the Server: it records each connection's peer (the
// SO_PEERCRED credentials of a Unix socket peer, the IP of a TCP peer) and
// closes connections beyond MaxConnections in all or
// MaxConnectionsPerPeer from one peer at once. Serve the grpc.Server on
// what it returns.
func (s *Server) Listen(l net.Listener) net.Listener { return &limitListener{Listener: l, s: s} }

type limitListener struct {
	net.Listener
	s *Server
}

// Accept returns the next connection within the limits, closing those
// beyond them.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		p := auth.PeerOf(c)
		if reason := l.s.conns.acquire(p.Key()); reason != "" {
			l.s.metrics.limited.WithLabelValues(reason).Inc()
			l.s.log.Debug("connection refused", "peer", p.String(), "limit", reason)
			_ = c.Close()
			continue
		}
		return &peerConn{Conn: c, addr: peerAddr{peer: p, Addr: c.RemoteAddr()}, release: func() { l.s.conns.release(p.Key()) }}, nil
	}
}

// peerConn is an accepted connection that knows its peer and releases its
// slot when closed.
type peerConn struct {
	net.Conn
	addr    peerAddr
	once    sync.Once
	release func()
}

// RemoteAddr returns the peer, which gRPC hands to handlers as peer.Addr.
func (c *peerConn) RemoteAddr() net.Addr { return c.addr }

func (c *peerConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// peerAddr is a connection's address with what the daemon learned of its
// peer when it connected.
type peerAddr struct {
	net.Addr
	peer auth.Peer
}

func (a peerAddr) String() string { return a.peer.String() }

// connCounter counts open connections, in all and per peer.
type connCounter struct {
	max, perPeer int

	mu     sync.Mutex // guards total and byPeer
	total  int
	byPeer map[string]int
}

// acquire takes a slot for a connection of peer, or returns the name of
// the limit that refuses it.
func (c *connCounter) acquire(peer string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.total >= c.max:
		return "connections"
	case c.byPeer[peer] >= c.perPeer:
		return "connections_per_peer"
	}
	c.total++
	c.byPeer[peer]++
	return ""
}

func (c *connCounter) release(peer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total--
	if c.byPeer[peer]--; c.byPeer[peer] <= 0 {
		delete(c.byPeer, peer)
	}
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

package auth

import (
	"fmt"
	"net"
	"net/netip"
)

// Peer is what the transport says about a caller's process: the
// credentials of a Unix socket peer when it connected (SO_PEERCRED), or
// the address of a TCP peer. It is recorded in logs and introspection and
// keys per-source limits; it authenticates no one by itself.
type Peer struct {
	// Network is "unix" or "tcp".
	Network string
	// Cred reports whether UID, GID and PID are known (Unix socket, Linux).
	Cred     bool
	UID, GID uint32
	// PID is the peer's process ID in the daemon's PID namespace; 0 if the
	// peer is in another one.
	PID int32
	// IP of a TCP peer.
	IP string
}

// PeerOf describes the process at the other end of c.
func PeerOf(c net.Conn) Peer {
	switch c := c.(type) {
	case *net.UnixConn:
		p := Peer{Network: "unix"}
		p.UID, p.GID, p.PID, p.Cred = unixCred(c)
		return p
	case *net.TCPConn:
		p := Peer{Network: "tcp"}
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			p.IP = a.IP.String()
		}
		return p
	}
	return Peer{Network: c.RemoteAddr().Network()}
}

// Key identifies the peer's source for per-source limits: its uid on a
// Unix socket; over TCP, "loopback" for every loopback address (127.0.0.0/8,
// ::1 and their IPv4-mapped forms: any local process may bind any of them),
// the /64 of an IPv6 address (one host is commonly given a whole /64), and
// the address itself otherwise. So a local process cannot multiply its
// limits by choosing source addresses.
func (p Peer) Key() string {
	switch {
	case p.Cred:
		return fmt.Sprintf("uid %d", p.UID)
	case p.IP != "":
		return sourceOf(p.IP)
	}
	return p.Network + " peer"
}

// sourceOf is the Key of a TCP peer at ip.
func sourceOf(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return "ip " + ip // not from net.TCPAddr: kept as it is
	}
	a = a.WithZone("").Unmap()
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.Is6():
		return "ip " + netip.PrefixFrom(a, 64).Masked().String()
	}
	return "ip " + a.String()
}

// String describes the peer for logs and introspection.
func (p Peer) String() string {
	switch {
	case p.Cred:
		return fmt.Sprintf("uid=%d gid=%d pid=%d", p.UID, p.GID, p.PID)
	case p.IP != "":
		return "ip=" + p.IP
	}
	return p.Network
}

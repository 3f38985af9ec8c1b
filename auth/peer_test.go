package auth

import "testing"

// TestPeerKey: loopback addresses are one source, IPv6 peers are keyed by
// their /64, other IPv4 peers by their address, Unix socket peers by uid.
func TestPeerKey(t *testing.T) {
	for _, tt := range []struct {
		name string
		peer Peer
		want string
	}{
		{"unix, uid", Peer{Network: "unix", Cred: true, UID: 1000, GID: 1000, PID: 42}, "uid 1000"},
		{"unix, another pid of the uid", Peer{Network: "unix", Cred: true, UID: 1000, PID: 43}, "uid 1000"},
		{"unix, no credentials", Peer{Network: "unix"}, "unix peer"},
		{"127.0.0.1", Peer{Network: "tcp", IP: "127.0.0.1"}, "loopback"},
		{"127.0.0.2", Peer{Network: "tcp", IP: "127.0.0.2"}, "loopback"},
		{"127.255.255.254", Peer{Network: "tcp", IP: "127.255.255.254"}, "loopback"},
		{"::1", Peer{Network: "tcp", IP: "::1"}, "loopback"},
		{"IPv4-mapped 127.0.0.21", Peer{Network: "tcp", IP: "::ffff:127.0.0.21"}, "loopback"},
		{"IPv4 pod", Peer{Network: "tcp", IP: "10.244.1.7"}, "ip 10.244.1.7"},
		{"another IPv4 pod", Peer{Network: "tcp", IP: "10.244.1.8"}, "ip 10.244.1.8"},
		{"IPv4-mapped pod", Peer{Network: "tcp", IP: "::ffff:10.244.1.7"}, "ip 10.244.1.7"},
		{"128.0.0.1 is not loopback", Peer{Network: "tcp", IP: "128.0.0.1"}, "ip 128.0.0.1"},
		{"IPv6", Peer{Network: "tcp", IP: "2001:db8:1:2:aaaa::1"}, "ip 2001:db8:1:2::/64"},
		{"IPv6, same /64", Peer{Network: "tcp", IP: "2001:db8:1:2:ffff:ffff:ffff:ffff"}, "ip 2001:db8:1:2::/64"},
		{"IPv6, next /64", Peer{Network: "tcp", IP: "2001:db8:1:3::1"}, "ip 2001:db8:1:3::/64"},
		{"IPv6 link-local with a zone", Peer{Network: "tcp", IP: "fe80::1%eth0"}, "ip fe80::/64"},
		{"unparsable", Peer{Network: "tcp", IP: "not-an-ip"}, "ip not-an-ip"},
		{"unknown", Peer{Network: "pipe"}, "pipe peer"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.peer.Key(); got != tt.want {
				t.Errorf("%+v.Key() = %q, want %q", tt.peer, got, tt.want)
			}
		})
	}
}

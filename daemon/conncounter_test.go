package daemon

import (
	"context"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/peer"

	"github.com/informerd/informerd/auth"
)

// testConns are connections named like "a1", whose peer is their first
// letter, over a connCounter.
type testConns struct {
	k      *connCounter
	byName map[string]*peerConn
	names  map[*peerConn]string
}

func newTestConns(maxConns, perPeer int) *testConns {
	return &testConns{
		k:      &connCounter{max: maxConns, perPeer: perPeer, byPeer: map[string]int{}},
		byName: map[string]*peerConn{}, names: map[*peerConn]string{},
	}
}

// conn returns a new connection named name, not yet admitted.
func (tc *testConns) conn(t *testing.T, name string) *peerConn {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	c := &peerConn{Conn: a, key: name[:1], counter: tc.k}
	c.addr = peerAddr{Addr: a.RemoteAddr(), peer: auth.Peer{Network: "pipe"}, conn: c}
	tc.byName[name], tc.names[c] = c, name
	return c
}

// authenticate marks name's connection as a call on it would.
func (tc *testConns) authenticate(name string) {
	tc.k.authenticated(peer.NewContext(context.Background(), &peer.Peer{Addr: tc.byName[name].addr}))
}

// check fails t if the counts disagree with the connections' states or
// exceed the limits.
func (tc *testConns) check(t *testing.T, maxPending int) {
	t.Helper()
	tc.k.mu.Lock()
	defer tc.k.mu.Unlock()
	open, pending := 0, 0
	for _, c := range tc.byName {
		if c.state != connUncounted {
			open++
		}
		if c.state == connPending {
			pending++
		}
	}
	listed := 0
	for _, l := range tc.k.pending {
		listed += l.Len()
	}
	if tc.k.total != open || tc.k.npending != pending || listed != pending || open > tc.k.max || pending > maxPending {
		t.Fatalf("total %d, unauthenticated %d (%d listed); want %d and %d, within %d and %d",
			tc.k.total, tc.k.npending, listed, open, pending, tc.k.max, maxPending)
	}
}

// TestConnCounter: which limit refuses a new connection, and which
// unauthenticated connection it displaces when the connections or their
// unauthenticated share are full: the oldest of the peer with the most,
// the new one counted.
func TestConnCounter(t *testing.T) {
	type step struct {
		op   string // open, auth or close
		conn string
		// displaced and refused are what an open must return.
		displaced, refused string
	}
	open := func(c string) step { return step{op: "open", conn: c} }
	for _, tt := range []struct {
		name                        string
		maxConns, perPeer, maxShare int
		steps                       []step
	}{
		{"within the limits", 10, 10, 5, []step{open("a1"), open("a2"), open("b1")}},
		{"per peer: refused, not displacing", 10, 2, 5, []step{
			open("a1"), open("a2"), {op: "open", conn: "a3", refused: "connections_per_peer"}, open("b1"),
		}},
		{"all authenticated: refused", 2, 10, 2, []step{
			open("a1"), {op: "auth", conn: "a1"}, open("b1"), {op: "auth", conn: "b1"},
			{op: "open", conn: "c1", refused: "connections"},
			{op: "close", conn: "a1"}, open("c2"),
		}},
		{"share full: the largest holder's oldest", 10, 10, 3, []step{
			open("a1"), open("a2"), open("b1"),
			{op: "open", conn: "c1", displaced: "a1"}, // a 2, b 1, c 1
			{op: "open", conn: "b2", displaced: "b1"}, // a 1, b 2, c 1
			{op: "open", conn: "d1", displaced: "a2"}, // a, b and c 1: a's is the oldest
		}},
		{"share full: a newcomer of the largest displaces its own", 10, 10, 2, []step{
			open("a1"), open("a2"), {op: "open", conn: "a3", displaced: "a1"}, {op: "open", conn: "a4", displaced: "a2"},
		}},
		{"all connections open: an unauthenticated one gives way", 3, 10, 3, []step{
			open("a1"), {op: "auth", conn: "a1"}, open("a2"), {op: "auth", conn: "a2"}, open("b1"),
			{op: "open", conn: "c1", displaced: "b1"},
		}},
		{"an authenticated connection leaves the share", 10, 10, 1, []step{
			open("a1"), {op: "auth", conn: "a1"}, {op: "auth", conn: "a1"}, open("b1"),
			{op: "open", conn: "c1", displaced: "b1"},
		}},
		{"a closed connection gives its slots back", 1, 1, 1, []step{
			open("a1"), {op: "close", conn: "a1"}, {op: "close", conn: "a1"}, open("a2"),
		}},
		{"a displaced connection closed again gives nothing back twice", 2, 10, 1, []step{
			open("a1"), {op: "open", conn: "a2", displaced: "a1"}, {op: "close", conn: "a1"},
			{op: "auth", conn: "a1"}, {op: "auth", conn: "a2"}, open("b1"),
			{op: "open", conn: "c1", displaced: "b1"},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := newTestConns(tt.maxConns, tt.perPeer)
			for i, s := range tt.steps {
				switch s.op {
				case "open":
					displaced, refused := tc.k.admit(tc.conn(t, s.conn), tt.maxShare, time.Hour, func(c *peerConn, _ string) {
						t.Errorf("%s closed by its timer", tc.names[c])
					})
					if tc.names[displaced] != s.displaced || refused != s.refused {
						t.Fatalf("step %d, open %s: displaced %q, refused %q; want %q and %q", i, s.conn, tc.names[displaced], refused, s.displaced, s.refused)
					}
				case "auth":
					tc.authenticate(s.conn)
				case "close":
					tc.byName[s.conn].Close()
				}
				tc.check(t, tt.maxShare)
			}
			for _, c := range tc.byName {
				c.Close() // stops the timers
			}
			tc.check(t, tt.maxShare)
		})
	}
}

// TestConnCounterTimeout: a connection not authenticated at the timeout
// is closed and gives its slots back; an authenticated one is not.
func TestConnCounterTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tc := newTestConns(10, 10)
		closed := make(chan string, 2)
		for _, name := range []string{"a1", "b1"} {
			if _, refused := tc.k.admit(tc.conn(t, name), 10, time.Second, func(c *peerConn, _ string) { closed <- tc.names[c] }); refused != "" {
				t.Fatal(refused)
			}
		}
		tc.authenticate("b1")
		time.Sleep(time.Second - time.Nanosecond)
		synctest.Wait()
		if len(closed) != 0 {
			t.Fatalf("%s closed before the timeout", <-closed)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if got := <-closed; got != "a1" || len(closed) != 0 {
			t.Fatalf("closed %s (and %d more) at the timeout; want a1 only", got, len(closed))
		}
		tc.check(t, 10)
		if tc.k.total != 1 {
			t.Fatalf("%d connections counted after the timeout, want 1 (b1)", tc.k.total)
		}
		tc.byName["b1"].Close()
		tc.check(t, 10)
	})
}

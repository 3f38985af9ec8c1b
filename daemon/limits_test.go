package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// bystander is a subscriber of its own identity that must keep receiving
// events whatever another caller does.
type bystander struct {
	api  *fakeAPIServer
	sub  *subscriber
	sent int
}

func newBystander(t *testing.T, api *fakeAPIServer, srv *testServer) *bystander {
	b := &bystander{api: api, sub: subscribe(t, srv, "bystander")}
	b.sub.waitSynced(t)
	return b
}

// stillReceives feeds an event and waits for the bystander to receive it.
func (b *bystander) stillReceives(t *testing.T) {
	t.Helper()
	b.sent++
	b.api.feed <- event(b.sent, 1000+b.sent, 10)
	b.sub.waitCount(t, b.sent)
}

// openStreams opens n streams of configmaps named name with c, each past
// its first response.
func openStreams(t *testing.T, c *client.Client, n int, name string) []*client.Stream {
	t.Helper()
	var ss []*client.Stream
	for range n {
		s, err := c.Stream(context.Background(), client.WatchOptions{Resource: configMaps, ClientName: name}, "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	return ss
}

// firstResponse opens a stream with c and returns what ends its first
// Recv: nil once it delivered events.
func firstResponse(c *client.Client, opts client.WatchOptions) error {
	s, err := c.Stream(context.Background(), opts, "")
	if err != nil {
		return err
	}
	defer s.Close()
	_, err = s.Recv()
	return err
}

// TestStreamsPerCallerLimit: a caller's streams beyond its limit get
// RESOURCE_EXHAUSTED naming the limit; another caller streams on and opens
// new streams; the caller gets a slot back when it closes a stream.
func TestStreamsPerCallerLimit(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) { c.opts.Limits.MaxStreamsPerCaller = 3 })
	by := newBystander(t, api, srv)
	greedy := srv.dial(t, "greedy")
	held := openStreams(t, greedy, 3, "greedy")
	err := firstResponse(greedy, client.WatchOptions{Resource: configMaps})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-streams-per-caller") {
		t.Fatalf("a 4th stream: %v; want RESOURCE_EXHAUSTED naming max-streams-per-caller", err)
	}
	by.stillReceives(t)
	if err := firstResponse(srv.dial(t, "newcomer"), client.WatchOptions{Resource: configMaps}); err != nil {
		t.Fatalf("another caller's new stream: %v", err)
	}
	held[0].Close()
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return firstResponse(greedy, client.WatchOptions{Resource: configMaps}) == nil, nil
	})
	if err != nil {
		t.Fatal("the caller never got its slot back after closing a stream")
	}
}

// TestRequestLimits: an oversized request and an overlong selector get
// RESOURCE_EXHAUSTED naming the limit, with a short message; so does
// oversized metadata; a bystander is unaffected.
func TestRequestLimits(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn)
	by := newBystander(t, api, srv)
	c := srv.dial(t, "attacker")
	for _, tt := range []struct {
		name     string
		selector string
		want     string
	}{
		{"3.9 MiB selector", strings.Repeat("a", 3900<<10) + " in (x", "larger than max"},
		{"10 KiB selector", strings.Repeat("a", 10<<10) + "=x", "max-selector-bytes"},
	} {
		err := firstResponse(c, client.WatchOptions{Resource: configMaps, LabelSelector: tt.selector})
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), tt.want) || len(err.Error()) > 512 {
			t.Errorf("%s: %.300v (%d bytes); want RESOURCE_EXHAUSTED mentioning %q in at most 512 bytes", tt.name, err, len(err.Error()), tt.want)
		}
	}
	// Metadata beyond MaxHeaderBytes: the request never reaches a handler.
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-padding", strings.Repeat("p", 32<<10))
	s, err := c.Stream(ctx, client.WatchOptions{Resource: configMaps}, "")
	if err == nil {
		_, err = s.Recv()
		s.Close()
	}
	if err == nil || len(err.Error()) > 512 {
		t.Errorf("32 KiB of metadata: %.300v; want a short error", err)
	}
	by.stillReceives(t)
}

// TestStreamsPerConnectionLimit: streams beyond MaxStreamsPerConnection on
// one connection wait for a free one; a bystander's connection is
// unaffected.
func TestStreamsPerConnectionLimit(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) { c.opts.Limits.MaxStreamsPerConnection = 2 })
	by := newBystander(t, api, srv)
	c := srv.dial(t, "multiplexer")
	held := openStreams(t, c, 2, "held")
	third := make(chan error, 1)
	go func() { third <- firstResponse(c, client.WatchOptions{Resource: configMaps, ClientName: "third"}) }()
	// The daemon has not started the third stream: it is not among the
	// subscribers (the fake API server allows the introspection).
	streamsOf := func(name string) int {
		resp, err := srv.dial(t, "introspector").API().ListInformers(context.Background(), &informerdv1.ListInformersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, in := range resp.GetInformers() {
			for _, s := range in.GetSubscribers() {
				if s.GetClientName() == name {
					n++
				}
			}
		}
		return n
	}
	by.stillReceives(t)
	if n, m := streamsOf("held"), streamsOf("third"); n != 2 || m != 0 {
		t.Fatalf("the daemon serves %d held and %d third streams on the connection, want 2 and 0", n, m)
	}
	held[0].Close()
	if err := <-third; err != nil {
		t.Fatalf("the third stream, once a stream closed: %v", err)
	}
}

// rawConn opens a connection to addr (from the local address from, if
// set) that speaks HTTP/2 frames directly.
func rawConn(t *testing.T, network, addr, from string) (net.Conn, *http2.Framer) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c, err := d.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, http2.NewFramer(c, c)
}

// greet sends the HTTP/2 client preface and an empty SETTINGS frame.
func greet(t *testing.T, c net.Conn, f *http2.Framer) {
	t.Helper()
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := f.WriteSettings(); err != nil {
		t.Fatal(err)
	}
}

// closedWithoutGoAway is what goAway returns for a connection that ended
// without a GOAWAY.
const closedWithoutGoAway = http2.ErrCode(^uint32(0))

// goAway reads frames until a GOAWAY or the end of the connection, within
// limit; it returns the GOAWAY's error code, or closedWithoutGoAway.
func goAway(t *testing.T, c net.Conn, f *http2.Framer, limit time.Duration) http2.ErrCode {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(limit))
	for {
		fr, err := f.ReadFrame()
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			t.Fatalf("the connection was neither closed nor sent a GOAWAY within %s", limit)
		case err != nil:
			return closedWithoutGoAway
		}
		if ga, ok := fr.(*http2.GoAwayFrame); ok {
			return ga.ErrCode
		}
	}
}

// TestKeepalivePolicy: a client that pings more often than
// KeepaliveMinTime is sent a GOAWAY (ENHANCE_YOUR_CALM) and disconnected;
// a bystander is unaffected.
func TestKeepalivePolicy(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn)
	by := newBystander(t, api, srv)
	c, f := rawConn(t, "unix", srv.socket, "")
	greet(t, c, f)
	go func() { // ends when the connection does
		for i := uint64(0); ; i++ {
			var data [8]byte
			data[0] = byte(i)
			if f.WritePing(false, data) != nil {
				return
			}
			time.Sleep(10 * time.Millisecond) // the flood's pace
		}
	}()
	if code := goAway(t, c, f, 10*time.Second); code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("a ping flood ended with GOAWAY code %v, want ENHANCE_YOUR_CALM", code)
	}
	by.stillReceives(t)
}

// TestConnectionLimits: one peer's connections beyond
// MaxConnectionsPerPeer are closed at once, whichever loopback address
// each comes from (every loopback address is one peer), connections that
// only sent a preface, and ones that sent nothing, are closed after
// ConnectionTimeout, while another peer (the Unix socket's uid) connects
// and streams.
func TestConnectionLimits(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) {
		c.tcp = true
		c.opts.Limits.MaxConnectionsPerPeer = 3
		c.opts.Limits.ConnectionTimeout = time.Second
	})
	by := newBystander(t, api, srv)
	// The attacker binds 127.0.0.2, .3 and .4 (any local process may),
	// then .5: all of them the one peer "loopback".
	type quiet struct {
		c net.Conn
		f *http2.Framer
	}
	var conns []quiet
	for i := range 3 {
		c, f := rawConn(t, "tcp", srv.tcp, fmt.Sprintf("127.0.0.%d", 2+i))
		greet(t, c, f)
		conns = append(conns, quiet{c, f})
	}
	extra, ef := rawConn(t, "tcp", srv.tcp, "127.0.0.5")
	if code := goAway(t, extra, ef, 5*time.Second); code != closedWithoutGoAway {
		t.Fatalf("a 4th connection of one peer, from another loopback address, got GOAWAY %v; want it closed at once", code)
	}
	if err := firstResponse(srv.dial(t, "newcomer"), client.WatchOptions{Resource: configMaps}); err != nil {
		t.Fatalf("another peer while one is at its limit: %v", err)
	}
	by.stillReceives(t)
	start := time.Now()
	for _, q := range conns {
		if code := goAway(t, q.c, q.f, 10*time.Second); code != closedWithoutGoAway {
			t.Fatalf("a connection that only sent a preface: GOAWAY %v, want it closed after ConnectionTimeout", code)
		}
	}
	t.Logf("quiet connections closed after %s (ConnectionTimeout 1s)", time.Since(start).Round(10*time.Millisecond))
	mute, mf := rawConn(t, "tcp", srv.tcp, "127.0.0.3")
	if code := goAway(t, mute, mf, 10*time.Second); code != closedWithoutGoAway {
		t.Fatalf("a connection that sent nothing: GOAWAY %v; want it closed after the handshake timeout", code)
	}
	// The closed connections gave their slots back.
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		c, f := rawConn(t, "tcp", srv.tcp, "127.0.0.2")
		defer c.Close()
		if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
			return false, nil // refused: still at the limit
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		fr, err := f.ReadFrame() // the server's SETTINGS, if admitted
		_, ok := fr.(*http2.SettingsFrame)
		return err == nil && ok, nil
	})
	if err != nil {
		t.Fatal("the peer never got its connection slots back")
	}
	by.stillReceives(t)
}

// TestAllowedUIDs: with an allow-list, a Unix socket caller whose uid is
// not in it is refused, naming the list; one whose uid is, is served.
func TestAllowedUIDs(t *testing.T) {
	api := newFakeAPIServer(t)
	me := uint32(os.Getuid())
	for _, tt := range []struct {
		allowed []uint32
		code    codes.Code
	}{{[]uint32{me + 1}, codes.PermissionDenied}, {[]uint32{me + 1, me}, codes.OK}} {
		srv := serve(t, api, authOn, func(c *serverConfig) { c.opts.AllowedUIDs = tt.allowed })
		err := firstResponse(srv.dial(t, "caller"), client.WatchOptions{Resource: configMaps})
		if status.Code(err) != tt.code || (err != nil && !strings.Contains(err.Error(), "allowed-uids")) {
			t.Errorf("uid %d with allowed uids %v: %v, want %s", me, tt.allowed, err, tt.code)
		}
	}
}

// TestInsecureLocalOnly: without authentication callers need no token and
// are named by their uid; sensitive resources are still refused.
func TestInsecureLocalOnly(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOff)
	c, err := client.Dial(srv.socket) // no token
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Stream(context.Background(), client.WatchOptions{Resource: configMaps, ClientName: "dev"}, "")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	resp, err := c.API().ListInformers(context.Background(), &informerdv1.ListInformersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	subs := resp.GetInformers()[0].GetSubscribers()
	if len(subs) != 1 || subs[0].GetUser() != fmt.Sprintf("uid %d", os.Getuid()) || !strings.Contains(subs[0].GetPeer(), fmt.Sprintf("pid=%d", os.Getpid())) {
		t.Fatalf("subscribers: %v; want this process, by uid and pid", subs)
	}
	err = firstResponse(c, client.WatchOptions{Resource: schema.GroupVersionResource{Version: "v1", Resource: "secrets"}})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "-serve-sensitive=secrets") {
		t.Fatalf("secrets without authentication: %v; want PERMISSION_DENIED saying how to opt in", err)
	}
}

// TestRecheck: a stream is checked again when its decision expires: a
// denial ends it with PERMISSION_DENIED; a review that fails leaves it
// running.
func TestRecheck(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) { c.authz.AllowTTL = 200 * time.Millisecond })
	sub := subscribe(t, srv, "rechecked")
	sub.waitSynced(t)
	api.fail.Store(true)
	before := api.reviews.Load()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return api.reviews.Load() > before, nil
	})
	if err != nil {
		t.Fatal("the stream was never checked again")
	}
	api.feed <- event(1, 2, 10)
	sub.waitCount(t, 1) // a failed review ends nothing
	api.fail.Store(false)
	api.deny.Store(true)
	select {
	case <-sub.ended:
	case <-time.After(30 * time.Second): // recheckRetry (10s) and the allow TTL, with room
		t.Fatal("a denied stream did not end")
	}
	if status.Code(sub.err) != codes.PermissionDenied || !strings.Contains(sub.err.Error(), "may not list configmaps cluster-wide") {
		t.Fatalf("the denied stream ended with %v; want PERMISSION_DENIED naming the verb, resource and scope", sub.err)
	}
}

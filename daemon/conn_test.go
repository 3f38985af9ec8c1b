package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/daemon"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// loopbackSources returns n loopback addresses other than 127.0.0.1
// (127.0.0.2 on) to dial from, skipping the test if they cannot be bound.
func loopbackSources(t *testing.T, n int) []string {
	t.Helper()
	var ips []string
	for i := range n {
		ip := fmt.Sprintf("127.0.0.%d", 2+i)
		l, err := net.Listen("tcp", ip+":0")
		if err != nil {
			t.Skipf("cannot bind %s (%v): this test needs loopback addresses beyond 127.0.0.1", ip, err)
		}
		l.Close()
		ips = append(ips, ip)
	}
	return ips
}

// prefaceOnly is a connection that sent the HTTP/2 preface and settings
// and nothing else.
type prefaceOnly struct {
	c net.Conn
	f *http2.Framer
}

// floodPrefaces opens n preface-only connections to srv's TCP address,
// from the sources in turn, and returns them once the daemon has taken
// each: it sent the connection its SETTINGS, or closed it.
func floodPrefaces(t *testing.T, srv *testServer, n int, sources []string) []prefaceOnly {
	t.Helper()
	var conns []prefaceOnly
	for i := range n {
		c, f := rawConn(t, "tcp", srv.tcp, sources[i%len(sources)])
		// The daemon may have closed it already: what a refused
		// connection's writes meet is no matter.
		if _, err := io.WriteString(c, http2.ClientPreface); err == nil {
			_ = f.WriteSettings()
		}
		conns = append(conns, prefaceOnly{c, f})
	}
	for _, p := range conns {
		_ = p.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		fr, err := p.f.ReadFrame() // the daemon's SETTINGS, or the end
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("the daemon neither served nor closed a connection within 10s")
		}
		if err == nil {
			if _, ok := fr.(*http2.SettingsFrame); !ok {
				t.Fatalf("the daemon's first frame is %v, want SETTINGS", fr)
			}
		}
	}
	return conns
}

// stillOpen reports which of conns the daemon has not closed: those that
// read no end within limit.
func stillOpen(conns []prefaceOnly, limit time.Duration) []bool {
	open := make([]bool, len(conns))
	var wg sync.WaitGroup
	for i, p := range conns {
		wg.Add(1)
		go func() { // ends within limit
			defer wg.Done()
			_ = p.c.SetReadDeadline(time.Now().Add(limit))
			for {
				_, err := p.f.ReadFrame()
				var ne net.Error
				if err != nil {
					open[i] = errors.As(err, &ne) && ne.Timeout()
					return
				}
			}
		}()
	}
	wg.Wait()
	return open
}

// limitRejections reads informerd_limit_rejections_total{limit=limit}.
func limitRejections(t *testing.T, reg *prometheus.Registry, limit string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "informerd_limit_rejections_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "limit" && l.GetValue() == limit {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// served returns how long a new caller named name waited until a Watch
// of it was served, dialing again until it is or limit has passed.
func served(t *testing.T, srv *testServer, name string, limit time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		c, err := client.Dial(srv.socket, srv.credentials(name)...)
		if err != nil {
			return false, err
		}
		defer c.Close()
		last = firstResponse(c, client.WatchOptions{Resource: configMaps})
		return last == nil, nil
	})
	if err != nil {
		return time.Since(start), fmt.Errorf("not served within %s: %w", limit, last)
	}
	return time.Since(start), nil
}

// TestUnauthenticatedConnectionsGiveWay (defect 5): with 40 connections
// of which 10 may be unauthenticated, 60 preface-only connections from
// five loopback addresses leave only the newest 10 open (each new one
// displaced the oldest); a new caller with a token is then served within
// a second, displacing one more, and a bystander's open stream keeps
// receiving.
func TestUnauthenticatedConnectionsGiveWay(t *testing.T) {
	const share, flood = 10, 60
	sources := loopbackSources(t, 5)
	api := newFakeAPIServer(t)
	reg := prometheus.NewRegistry()
	srv := serve(t, api, authOn, func(c *serverConfig) {
		c.tcp, c.opts.Registerer = true, reg
		c.opts.Limits.MaxConnections, c.opts.Limits.MaxUnauthenticatedConnections = 40, share
		c.opts.Limits.ConnectionTimeout = time.Minute // only the share closes them here
	})
	by := newBystander(t, api, srv)
	conns := floodPrefaces(t, srv, flood, sources)
	open := stillOpen(conns, 300*time.Millisecond)
	for i, o := range open {
		if want := i >= flood-share; o != want {
			t.Fatalf("preface-only connection %d of %d open: %v; want only the newest %d open", i+1, flood, o, share)
		}
	}
	if got := limitRejections(t, reg, "unauthenticated_connections"); got != flood-share {
		t.Errorf("limit_rejections_total{limit=unauthenticated_connections} = %v, want %d", got, flood-share)
	}
	waited, err := served(t, srv, "newcomer", 10*time.Second)
	if err != nil || waited > time.Second {
		t.Fatalf("a new caller while unauthenticated connections fill their share: waited %s: %v; want served within 1s", waited, err)
	}
	t.Logf("a new caller was served in %s", waited.Round(time.Millisecond))
	by.stillReceives(t)
	if n := countTrue(stillOpen(conns, 300*time.Millisecond)); n != share-1 {
		t.Errorf("%d preface-only connections open after the new caller's, want %d", n, share-1)
	}
}

func countTrue(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// TestUnauthenticatedConnectionsTimeOut (defect 5): a connection that has
// not made an authenticated call within ConnectionTimeout is closed
// (without a GOAWAY), whether it only sent a preface or only made a
// token-less health Check; a connection on which a call passed
// authentication (with a token, or any call in InsecureLocalOnly mode)
// stays open past it, until MaxConnectionIdle closes it.
func TestUnauthenticatedConnectionsTimeOut(t *testing.T) {
	const timeout, idle = 500 * time.Millisecond, 3 * time.Second
	for _, sec := range []security{authOn, authOff} {
		t.Run("auth "+sec.String(), func(t *testing.T) {
			api := newFakeAPIServer(t)
			srv := serve(t, api, sec, func(c *serverConfig) {
				c.health = true
				c.opts.Limits.ConnectionTimeout, c.opts.Limits.MaxConnectionIdle = timeout, idle
			})
			dial := func(name string) *grpc.ClientConn { return grpcConn(t, srv, name) }
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			caller := dial("caller")
			if _, err := informerdv1.NewInformerServiceClient(caller).Version(ctx, &informerdv1.VersionRequest{}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			prober := dial("")
			if _, err := healthpb.NewHealthClient(prober).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatal(err)
			}
			c, f := rawConn(t, "unix", srv.socket, "")
			greet(t, c, f)
			if code := goAway(t, c, f, 10*time.Second); code != closedWithoutGoAway {
				t.Fatalf("a preface-only connection ended with GOAWAY %v; want it closed after ConnectionTimeout", code)
			}
			if !prober.WaitForStateChange(ctx, connectivity.Ready) {
				t.Fatal("a connection that made only a token-less health Check was never closed")
			}
			if elapsed := time.Since(start); elapsed < timeout {
				t.Fatalf("unauthenticated connections closed after %s, before ConnectionTimeout (%s)", elapsed, timeout)
			}
			// The caller connected first: its ConnectionTimeout has passed too.
			if s := caller.GetState(); s != connectivity.Ready {
				t.Fatalf("the authenticated connection is %s after ConnectionTimeout, want READY", s)
			}
			if !caller.WaitForStateChange(ctx, connectivity.Ready) {
				t.Fatal("the authenticated connection was never closed after MaxConnectionIdle")
			}
		})
	}
}

// TestUnauthenticatedConnectionFlood (defect 5, at the scale):
// 2,100 preface-only connections from 127.0.0.2-6 against the default
// limits (2,048 connections, 512 per peer, 512 unauthenticated), and
// against a per-peer limit that admits them all (as from many sources):
// during each, a new caller with a token on the socket is served within a
// second and a bystander's stream keeps receiving.
func TestUnauthenticatedConnectionFlood(t *testing.T) {
	const flood = 2100
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 2*flood+1024 {
		t.Skipf("needs %d open files (both ends of each connection); the limit is %d", 2*flood+1024, lim.Cur)
	}
	sources := loopbackSources(t, 5)
	for _, tt := range []struct {
		name   string
		limits daemon.Limits
	}{
		{"default limits", daemon.Limits{}},
		{"one peer may open them all", daemon.Limits{MaxConnectionsPerPeer: 4096}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			api := newFakeAPIServer(t)
			reg := prometheus.NewRegistry()
			srv := serve(t, api, authOn, func(c *serverConfig) { c.tcp, c.opts.Limits, c.opts.Registerer = true, tt.limits, reg })
			by := newBystander(t, api, srv)
			start := time.Now()
			conns := floodPrefaces(t, srv, flood, sources)
			flooded := time.Since(start)
			waited, err := served(t, srv, "newcomer", 15*time.Second)
			t.Logf("%d preface-only connections in %s (refused: %v per peer, %v unauthenticated displaced, %v at the total); a new caller waited %s (%v)",
				len(conns), flooded.Round(time.Millisecond), limitRejections(t, reg, "connections_per_peer"),
				limitRejections(t, reg, "unauthenticated_connections"), limitRejections(t, reg, "connections"), waited.Round(time.Millisecond), err)
			if err != nil || waited > time.Second {
				t.Errorf("a new caller during the flood waited %s: %v; want served within 1s", waited, err)
			}
			by.stillReceives(t)
		})
	}
}

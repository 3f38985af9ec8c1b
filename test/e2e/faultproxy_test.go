package e2e

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/cache"
)

// faultProxy forwards TCP connections from a loopback port to a target and
// injects faults: Hang stops forwarding on every connection, new ones
// included, without closing anything (a black hole); Drop resets every
// open connection.
type faultProxy struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup // the accept loop and the copy goroutines

	mu    sync.Mutex // guards conns and gate
	conns map[net.Conn]struct{}
	// gate is closed while traffic flows and open (blocking) while hung.
	gate chan struct{}
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	open := make(chan struct{})
	close(open)
	p := &faultProxy{l: l, target: target, conns: map[net.Conn]struct{}{}, gate: open}
	p.wg.Add(1)
	go p.accept() // ends when Close closes the listener
	t.Cleanup(p.Close)
	return p
}

func (p *faultProxy) addr() string { return p.l.Addr().String() }

func (p *faultProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, up) // each ends when either side closes
		go p.pipe(up, c)
	}
}

// pipe copies src to dst, waiting at the gate before every write.
func (p *faultProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			gate := p.gate
			p.mu.Unlock()
			<-gate // blocks while hung; Drop or Close unblock by closing conns
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Hang black-holes traffic until Resume.
func (p *faultProxy) Hang() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
		p.gate = make(chan struct{})
	default: // already hung
	}
}

// Resume lets traffic flow again.
func (p *faultProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.gate:
	default:
		close(p.gate)
	}
}

// Drop resets every open connection.
func (p *faultProxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // RST, not FIN
		}
		c.Close()
	}
}

// Close stops the proxy and waits for its goroutines.
func (p *faultProxy) Close() {
	p.l.Close()
	p.Resume()
	p.Drop()
	p.wg.Wait()
}

// TestFaultyNetworkToAPIServer: between daemon and API server the network
// resets connections, then black-holes them. Watches fail or time out
// (the idle timeout bounds a hang), the informer reports stale, and after
// the network heals the clients converge within the timeout plus backoff.
func TestFaultyNetworkToAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "faulty")
	for i := range 5 {
		createConfigMap(ctx, t, ns, fmt.Sprintf("cm%d", i), nil)
	}
	u, err := url.Parse(env.APIServerURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFaultProxy(t, u.Host)
	cfg := env.RESTConfig()
	cfg.Host = "https://" + proxy.addr()
	const idle = 3 * time.Second
	d := startDaemon(t, cache.Options{Config: cfg, Scope: cache.ScopeNamespace, UpstreamTimeout: idle})
	recs, ws := startWatchers(ctx, t, d.socket, ns, 3)
	stale := func() bool {
		src := d.mgr.Sources()
		return len(src) == 1 && src[0].State == cache.StateStale
	}
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	mutate := func(name string) {
		createConfigMap(ctx, t, ns, name, nil)
		if err := cms.Delete(ctx, "cm"+name[len(name)-1:], metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Reset: the watch fails at once and is re-opened.
	proxy.Drop()
	mutate("after-drop-1")
	converge(ctx, t, listState(ctx, t, configMaps, ns), recs)

	// Black hole: nothing arrives; the idle timeout abandons the watch.
	proxy.Hang()
	hungAt := time.Now()
	mutate("during-hang-2")
	eventually(ctx, t, "informer stale while the network hangs", stale)
	noticed := time.Since(hungAt)
	if noticed > 3*idle {
		t.Errorf("a hung watch went unnoticed for %s, with an idle timeout of %s", noticed, idle)
	}
	proxy.Resume()
	healedAt := time.Now()
	converge(ctx, t, listState(ctx, t, configMaps, ns), recs)
	t.Logf("hang noticed after %s (idle timeout %s); converged %s after the network healed",
		noticed, idle, time.Since(healedAt))
	expectNoResets(t, ws, "network faults upstream")
}

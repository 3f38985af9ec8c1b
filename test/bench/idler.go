package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// streamsPerConnection is how many streams an idle client puts on one
// connection: under the daemon's -max-streams-per-connection (256), past
// which streams wait.
const streamsPerConnection = 100

// idleResult is what an idle client process reports on stdout when it
// ends.
type idleResult struct {
	// Events counts what the client's streams received between "start"
	// and "stop" (events of Watch and WatchStatus, answers of
	// WatchAddress).
	Events int64 `json:"events"`
}

// runIdler is the role of one idle client process: open -streams streams
// of -kind, print "synced" once each has its initial state, count what
// arrives between a "start" and a "stop" line on stdin, and report an
// idleResult when stdin closes. A stream that ends before then fails the
// process.
func runIdler(args []string) error {
	fs := flag.NewFlagSet("bench idler", flag.ContinueOnError)
	kind := fs.String("kind", idleWatch, "watch, status or address")
	socket := fs.String("socket", "", "informerd's socket")
	tokenFile := fs.String("token-file", "", "the client's ServiceAccount token for informerd's audience")
	name := fs.String("name", "idle", "client name")
	ns := fs.String("namespace", namespace, "namespace of the objects")
	streams := fs.Int("streams", 100, "streams to open")
	first := fs.Int("first", 0, "index of the first stream, so that processes ask for different objects")
	configMaps := fs.Int("configmaps", 100, "ConfigMaps cm-00000... that exist")
	pods := fs.Int("pods", 100, "benchmark Pods that exist")
	statusObjects := fs.Int("status-objects", 10, "objects per status stream")
	addrFile := fs.String("addresses", "", "file of IP:port to watch, one a line (kind address)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var addrs []netip.AddrPort
	if *kind == idleAddress {
		b, err := os.ReadFile(*addrFile)
		if err != nil {
			return err
		}
		for _, l := range strings.Fields(string(b)) {
			a, err := netip.ParseAddrPort(l)
			if err != nil {
				return fmt.Errorf("-addresses: %w", err)
			}
			addrs = append(addrs, a)
		}
	}
	conns := make([]*client.Client, (*streams+streamsPerConnection-1)/streamsPerConnection)
	for i := range conns {
		c, err := client.Dial(*socket, client.WithTokenFile(*tokenFile))
		if err != nil {
			return err
		}
		defer c.Close()
		conns[i] = c
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		counting atomic.Bool
		events   atomic.Int64
		synced   sync.WaitGroup
		wg       sync.WaitGroup
		failed   = make(chan error, *streams)
	)
	got := func(n int) {
		if counting.Load() {
			events.Add(int64(n))
		}
	}
	synced.Add(*streams)
	for i := range *streams {
		idx := *first + i
		s := idleStream{c: conns[i/streamsPerConnection], name: *name, synced: sync.OnceFunc(synced.Done), got: got}
		var run func(context.Context) error
		switch *kind {
		case idleWatch:
			run = func(ctx context.Context) error { return s.watch(ctx, *ns, idx) }
		case idleStatus:
			run = func(ctx context.Context) error { return s.status(ctx, *ns, idx, *statusObjects, *configMaps, *pods) }
		case idleAddress:
			run = func(ctx context.Context) error { return s.address(ctx, addrs[idx%len(addrs)]) }
		default:
			return fmt.Errorf("-kind %q: want watch, status or address", *kind)
		}
		wg.Add(1)
		go func() { // ends with ctx or the stream
			defer wg.Done()
			if err := run(ctx); err != nil && ctx.Err() == nil {
				failed <- fmt.Errorf("stream %d: %w", idx, err)
			}
		}()
	}
	allSynced := make(chan struct{})
	go func() { synced.Wait(); close(allSynced) }() // ends when every stream synced (or the process exits)
	select {
	case <-allSynced:
	case err := <-failed:
		return err
	}
	fmt.Println("synced")

	lines := make(chan string)
	go func() { // ends when stdin closes
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	for done := false; !done; {
		select {
		case l, ok := <-lines:
			done = !ok
			switch l {
			case "start":
				counting.Store(true)
			case "stop":
				counting.Store(false)
			}
		case err := <-failed:
			return err
		}
	}
	cancel()
	wg.Wait()
	select {
	case err := <-failed:
		return err
	default:
	}
	return json.NewEncoder(os.Stdout).Encode(idleResult{Events: events.Load()})
}

// idleStream opens one stream and reads it until ctx ends.
type idleStream struct {
	c      *client.Client
	name   string
	synced func()    // called once the stream has its initial state
	got    func(int) // called with what arrives after that
}

// watch is a Watch of ConfigMaps (even idx) or Pods (odd) in ns.
func (s idleStream) watch(ctx context.Context, ns string, idx int) error {
	st, err := s.c.Stream(ctx, client.WatchOptions{Resource: resources[idx%2], Namespace: ns, ClientName: s.name}, "")
	if err != nil {
		return err
	}
	defer st.Close()
	isSynced := false
	for {
		evs, err := st.Recv()
		if err != nil {
			return err
		}
		if isSynced {
			s.got(len(evs))
			continue
		}
		for _, ev := range evs {
			if ev.GetType() == informerdv1.EventType_EVENT_TYPE_SYNCED {
				isSynced = true
				s.synced()
			}
		}
	}
}

// status is a WatchStatus of n objects, ConfigMaps and Pods alternately,
// from the idx-th group of n.
func (s idleStream) status(ctx context.Context, ns string, idx, n, configMaps, pods int) error {
	req := &informerdv1.WatchStatusRequest{ClientName: s.name}
	for j := range n {
		k := (idx*n + j) / 2
		ref := &informerdv1.ObjectReference{Kind: "ConfigMap", Namespace: ns, Name: cmName(k % configMaps)}
		if j%2 == 1 {
			ref = &informerdv1.ObjectReference{Kind: "Pod", Namespace: ns, Name: benchPod(k % pods).Name}
		}
		req.Objects = append(req.Objects, ref)
	}
	st, err := s.c.API().WatchStatus(ctx, req)
	if err != nil {
		return err
	}
	isSynced := false
	for {
		resp, err := st.Recv()
		if err != nil {
			return err
		}
		if isSynced {
			s.got(len(resp.GetEvents()))
			continue
		}
		for _, ev := range resp.GetEvents() {
			if ev.GetType() == informerdv1.StatusEventType_STATUS_EVENT_TYPE_SYNCED {
				isSynced = true
				s.synced()
			}
		}
	}
}

// address is a WatchAddress of a; its first answer is its initial state.
func (s idleStream) address(ctx context.Context, a netip.AddrPort) error {
	st, err := s.c.API().WatchAddress(ctx, &informerdv1.WatchAddressRequest{Ip: a.Addr().String(), Port: uint32(a.Port()), ClientName: s.name})
	if err != nil {
		return err
	}
	for n := 0; ; n++ {
		if _, err := st.Recv(); err != nil {
			return err
		}
		if n == 0 {
			s.synced()
		} else {
			s.got(1)
		}
	}
}

// idleResult closes stdin and reads the client's report.
func (p *clientProc) idleResult() (idleResult, error) {
	p.stdin.Close()
	var res idleResult
	if err := json.NewDecoder(p.out).Decode(&res); err != nil {
		if werr := p.cmd.Wait(); werr != nil {
			return res, fmt.Errorf("client %d: %w", p.cmd.Process.Pid, werr)
		}
		return res, fmt.Errorf("reading the result of client %d: %w", p.cmd.Process.Pid, err)
	}
	if err := p.cmd.Wait(); err != nil {
		return res, fmt.Errorf("client %d: %w", p.cmd.Process.Pid, err)
	}
	return res, nil
}

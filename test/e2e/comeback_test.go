package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/statuswatcher"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// arrivals notes when something happens (a message on a client's streams,
// a call of its handler) since it was last cleared.
type arrivals struct {
	mu      sync.Mutex // guards the fields below
	times   []time.Time
	changed chan struct{} // closed and renewed on each note
}

func newArrivals() *arrivals { return &arrivals{changed: make(chan struct{})} }

func (a *arrivals) note() {
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.times = append(a.times, now)
	close(a.changed)
	a.changed = make(chan struct{})
}

// next returns a channel closed at the next arrival.
func (a *arrivals) next() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

func (a *arrivals) clear() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.times = nil
}

// firstAfter waits for the first arrival at or after t and returns it.
func (a *arrivals) firstAfter(ctx context.Context, t time.Time) (time.Time, bool) {
	for {
		a.mu.Lock()
		i := slices.IndexFunc(a.times, func(at time.Time) bool { return !at.Before(t) })
		var at time.Time
		if i >= 0 {
			at = a.times[i]
		}
		changed := a.changed
		a.mu.Unlock()
		if i >= 0 {
			return at, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return time.Time{}, false
		}
	}
}

// noteReceives is a dial option noting every message the client's streams
// receive.
func noteReceives(a *arrivals) grpc.DialOption {
	return grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string,
		streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return notingStream{cs, a}, nil
	})
}

type notingStream struct {
	grpc.ClientStream
	a *arrivals
}

func (s notingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.a.note()
	}
	return err
}

// noting is a handler that notes its calls.
func noting(a *arrivals) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.note() },
		UpdateFunc: func(any, any) { a.note() },
		DeleteFunc: func(any) { a.note() },
	}
}

// socketAccepts returns when a Unix socket first accepts a connection
// (polled every millisecond: nothing announces it).
func socketAccepts(ctx context.Context, socket string) <-chan time.Time {
	at := make(chan time.Time, 1)
	go func() { // ends when the socket accepts or ctx ends
		for ctx.Err() == nil {
			if c, err := net.Dial("unix", socket); err == nil {
				at <- time.Now()
				c.Close()
				return
			}
			hold(ctx, time.Millisecond)
		}
	}()
	return at
}

// cpuTime is the CPU time this process has used.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clientKind is one kind of client of the library, with when its streams
// receive messages and when its handler is called.
type clientKind struct {
	name             string
	stream, handler  *arrivals
	backs, handlings []time.Duration
}

// TestClientsBackAfterDaemonKill (issue 21, defect 6): the daemon process
// is killed (-9) while every kind of client streams from it, and restarted
// after each outage of INFORMERD_E2E_KILL_OUTAGES (default 1s,1s,1s,8s,60s);
// each outage creates and deletes a ConfigMap and flips a pod's readiness.
// With the library's default options, every kind receives the new
// daemon's first message, and its handler sees the outage's changes,
// within 1 s of its socket accepting: the informers over the
// ListerWatcher, the factory and the dynamic client too, whose resumed
// watches turn the new daemon's RESET into the changes rather than into
// 410 (on which client-go's reflector would relist only after its backoff,
// 0.8 s and more). While the daemon is away the clients' process uses next
// to no CPU (at most 5% of a core for the six of them, under the race
// detector).
func TestClientsBackAfterDaemonKill(t *testing.T) {
	outages := "1s,1s,1s,8s,60s"
	if v := os.Getenv("INFORMERD_E2E_KILL_OUTAGES"); v != "" {
		outages = v
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	ns := podNamespace(ctx, t, "comeback")
	pod := createPod(ctx, t, ns, podSpec{name: "web", ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}})
	rounds := strings.Split(outages, ",")
	for i := range rounds {
		createConfigMap(ctx, t, ns, fmt.Sprintf("victim-%d", i), nil)
	}
	d := startDaemonProcess(t, filepath.Join(t.TempDir(), "informerd.sock"))

	kinds := map[string]*clientKind{}
	dial := func(name string, perms ...permission) *client.Client {
		k := &clientKind{name: name, stream: newArrivals(), handler: newArrivals()}
		kinds[name] = k
		return dialWith(t, d.socket, client.WithToken(identity(t, perms...)), noteReceives(k.stream))
	}
	runCtx, stopClients := context.WithCancel(ctx)
	var running sync.WaitGroup
	var shutdowns []func()
	defer func() {
		stopClients()
		for _, f := range shutdowns {
			f()
		}
		running.Wait()
	}()
	run := func(f func()) {
		running.Add(1)
		go func() { defer running.Done(); f() }() // ends with runCtx
	}
	var synced []toolscache.InformerSynced

	// Watcher.
	wc := dial("Watcher", reads(configMaps, ns))
	w := client.NewWatcher(wc, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "comeback-watcher"}, noting(kinds["Watcher"].handler), client.WatcherOptions{})
	run(func() {
		if err := w.Run(runCtx); err != nil {
			t.Errorf("Watcher: %v", err)
		}
	})
	synced = append(synced, w.HasSynced)

	// ListerWatcher under a SharedIndexInformer.
	lwc := dial("ListerWatcher", reads(configMaps, ns))
	lwInf := toolscache.NewSharedIndexInformer(client.NewListerWatcher(lwc, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "comeback-lw"}),
		&unstructured.Unstructured{}, 0, toolscache.Indexers{})
	if _, err := lwInf.AddEventHandler(noting(kinds["ListerWatcher"].handler)); err != nil {
		t.Fatal(err)
	}
	run(func() { lwInf.RunWithContext(runCtx) })
	synced = append(synced, lwInf.HasSynced)

	// The factory, typed.
	f := client.NewInformerFactory(dial("factory", reads(configMaps, ns)), client.FactoryOptions{Namespace: ns, ClientName: "comeback-factory"})
	fInf, err := f.InformerFor(&corev1.ConfigMap{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fInf.AddEventHandler(noting(kinds["factory"].handler)); err != nil {
		t.Fatal(err)
	}
	f.Start(runCtx)
	shutdowns = append(shutdowns, f.Shutdown)
	synced = append(synced, fInf.HasSynced)

	// The dynamic client under dynamicinformer.
	dynFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client.NewDynamicClient(dial("dynamic", reads(configMaps, ns)), "comeback-dynamic", nil), 0, ns, nil)
	dynInf := dynFactory.ForResource(configMaps).Informer()
	if _, err := dynInf.AddEventHandler(noting(kinds["dynamic"].handler)); err != nil {
		t.Fatal(err)
	}
	dynFactory.Start(runCtx.Done())
	shutdowns = append(shutdowns, dynFactory.Shutdown)
	synced = append(synced, dynInf.HasSynced)

	// StatusWatcher, of the ConfigMaps each outage creates.
	var ids object.ObjMetadataSet
	for i := range rounds {
		ids = append(ids, object.ObjMetadata{Namespace: ns, Name: fmt.Sprintf("down-%d", i), GroupKind: schema.GroupKind{Kind: "ConfigMap"}})
	}
	sw := statuswatcher.New(dial("StatusWatcher", reads(configMaps, ns)), statuswatcher.Options{ClientName: "comeback-status"})
	statusHandled := kinds["StatusWatcher"].handler
	statusSynced := make(chan struct{})
	events := sw.Watch(runCtx, ids, watcher.Options{})
	run(func() {
		for ev := range events {
			switch ev.Type {
			case event.SyncEvent:
				close(statusSynced)
			case event.ResourceUpdateEvent:
				statusHandled.note()
			case event.ErrorEvent:
				t.Errorf("StatusWatcher: %v", ev.Error)
			}
		}
	})

	// AddressWatcher, of the pod whose readiness each outage flips.
	addressSynced := make(chan struct{})
	var addressOnce sync.Once
	ac := dial("AddressWatcher", readsPods)
	addressHandled := kinds["AddressWatcher"].handler
	aw := client.NewAddressWatcher(ac, client.AddressOptions{Address: netip.MustParseAddrPort(pod.Status.PodIP + ":8080"), ClientName: "comeback-address"},
		func(*informerdv1.WatchAddressResponse) {
			addressHandled.note()
			addressOnce.Do(func() { close(addressSynced) })
		}, client.AddressWatcherOptions{})
	run(func() {
		if err := aw.Run(runCtx); err != nil {
			t.Errorf("AddressWatcher: %v", err)
		}
	})

	if !toolscache.WaitForCacheSync(ctx.Done(), synced...) {
		t.Fatal("the informers and the Watcher never synced")
	}
	for what, ch := range map[string]chan struct{}{"StatusWatcher": statusSynced, "AddressWatcher": addressSynced} {
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("%s never synced", what)
		}
	}

	names := []string{"Watcher", "ListerWatcher", "factory", "dynamic", "StatusWatcher", "AddressWatcher"}
	for i, o := range rounds {
		outage, err := time.ParseDuration(o)
		if err != nil {
			t.Fatalf("INFORMERD_E2E_KILL_OUTAGES: %v", err)
		}
		d.signal(syscall.SIGKILL)
		killed := time.Now()
		for _, k := range kinds {
			k.stream.clear()
			k.handler.clear()
		}
		// What changes while the daemon is away: every client's handler
		// has something to see. A deletion the new daemon cannot know of
		// makes it RESET the ConfigMap streams.
		createConfigMap(ctx, t, ns, fmt.Sprintf("down-%d", i), nil)
		if err := kubeClient(t).CoreV1().ConfigMaps(ns).Delete(ctx, fmt.Sprintf("victim-%d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		setReady(ctx, t, ns, "web", i%2 == 1)
		cpu := cpuTime(t)
		hold(ctx, outage-time.Since(killed))
		cpu = cpuTime(t) - cpu
		down := time.Since(killed)
		accepts := socketAccepts(ctx, d.socket)
		d.start()
		var ready time.Time
		select {
		case ready = <-accepts:
		case <-ctx.Done():
			t.Fatal("the new daemon's socket never accepted")
		}
		line := fmt.Sprintf("outage %s (clients' CPU %s while down):", down.Round(time.Millisecond), cpu.Round(time.Millisecond))
		for _, name := range names {
			k := kinds[name]
			back, ok := k.stream.firstAfter(ctx, ready)
			handled, ok2 := k.handler.firstAfter(ctx, ready)
			if !ok || !ok2 {
				t.Fatalf("after the %s outage, %s never came back (stream %v, handler %v)", outage, name, ok, ok2)
			}
			k.backs = append(k.backs, back.Sub(ready))
			k.handlings = append(k.handlings, handled.Sub(ready))
			line += fmt.Sprintf(" %s %s/%s", name, back.Sub(ready).Round(time.Millisecond), handled.Sub(ready).Round(time.Millisecond))
		}
		t.Log(line + " (first message received / first handler call, after the socket accepted)")
		if outage >= 30*time.Second && cpu > down/20 {
			t.Errorf("the clients used %s of CPU during a %s outage, want at most 5%% of a core", cpu, down)
		}
	}
	// The informers hold exactly what the API server has: the changes of
	// every outage, nothing more, nothing less.
	want, err := kubeClient(t).CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var wantKeys []string
	for _, cm := range want.Items {
		wantKeys = append(wantKeys, ns+"/"+cm.Name+"@"+cm.ResourceVersion)
	}
	slices.Sort(wantKeys)
	for name, inf := range map[string]toolscache.SharedIndexInformer{"ListerWatcher": lwInf, "factory": fInf, "dynamic": dynInf} {
		for {
			changed := kinds[name].handler.next()
			var got []string
			for _, obj := range inf.GetStore().List() {
				m := obj.(metav1.Object)
				got = append(got, m.GetNamespace()+"/"+m.GetName()+"@"+m.GetResourceVersion())
			}
			slices.Sort(got)
			if slices.Equal(got, wantKeys) {
				break
			}
			select {
			case <-changed:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s's informer holds %v, the API server %v", name, got, wantKeys)
			}
		}
	}
	for _, name := range names {
		k := kinds[name]
		t.Logf("%-14s first message after the daemon accepted: %s; first handler call: %s", name, spread(k.backs), spread(k.handlings))
		if m := slices.Max(k.backs); m > time.Second {
			t.Errorf("%s received its first message from the new daemon up to %s after it accepted, want within 1s", name, m)
		}
		if m := slices.Max(k.handlings); m > time.Second {
			t.Errorf("%s's handler saw the outage's change up to %s after the daemon accepted, want within 1s", name, m)
		}
	}
}

// spread summarizes durations: min, median and max.
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %s, median %s, max %s (n=%d)", r(s[0]), r(s[len(s)/2]), r(s[len(s)-1]), len(s))
}

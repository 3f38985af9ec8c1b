package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// latencies is a Watcher handler that records, for each update, the time
// from the write (a timestamp in the object) to the handler.
type latencies struct {
	mu      sync.Mutex // guards the fields below
	samples []time.Duration
	changed chan struct{} // closed and replaced on every sample
	synced  chan struct{}
}

func newLatencies() *latencies {
	return &latencies{changed: make(chan struct{}), synced: make(chan struct{})}
}

func (l *latencies) note(obj *unstructured.Unstructured) {
	ts, ok, _ := unstructured.NestedString(obj.Object, "data", "ts")
	if !ok {
		return
	}
	n, _ := strconv.ParseInt(ts, 10, 64)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.samples = append(l.samples, time.Since(time.Unix(0, n)))
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *latencies) OnAdd(obj any, _ bool) { l.note(obj.(*unstructured.Unstructured)) }
func (l *latencies) OnUpdate(_, obj any)   { l.note(obj.(*unstructured.Unstructured)) }
func (l *latencies) OnDelete(any)          {}
func (l *latencies) OnSynced()             { close(l.synced) }

// take waits for n samples and returns them, resetting the record.
func (l *latencies) take(ctx context.Context, t *testing.T, n int) []time.Duration {
	t.Helper()
	for {
		l.mu.Lock()
		got, ch := len(l.samples), l.changed
		if got >= n {
			s := l.samples
			l.samples = nil
			l.mu.Unlock()
			return s
		}
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("handler got %d of %d updates", got, n)
		}
	}
}

func p99(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)*99/100]
}

// TestSlowClientIsBounded: a client that stops reading while events flow
// costs the daemon bounded memory (its cursor falls out of the shared log;
// nothing is queued for it), does not hold back the other clients, and
// converges through a compacted catch-up when it reads again.
// INFORMERD_E2E_EVENTS sets the events per phase (default 2000).
func TestSlowClientIsBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	events := 2000
	if v := os.Getenv("INFORMERD_E2E_EVENTS"); v != "" {
		events, _ = strconv.Atoi(v)
	}
	ns := createNamespace(ctx, t, "slow")
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	const objects = 50
	for i := range objects {
		createConfigMap(ctx, t, ns, fmt.Sprintf("lat-%d", i), map[string]string{"ts": "0"})
	}
	d := startDaemonProcess(t, filepath.Join(t.TempDir(), "informerd.sock"),
		"-scope", "namespace", "-log-max-events", "1000", "-log-min-age", "0s", "-stream-write-timeout", "10m")
	opts := client.WatchOptions{Resource: configMaps, Namespace: ns}

	fast := make([]*latencies, 5)
	for i := range fast {
		c := dialSocket(t, d.socket, reads(configMaps, ns))
		fast[i] = newLatencies()
		o := opts
		o.ClientName = fmt.Sprintf("fast-%d", i)
		runWatcher(t, c, o, fast[i])
		<-fast[i].synced
		fast[i].take(ctx, t, objects) // the snapshot
	}
	write := func(n int) string {
		var last *corev1.ConfigMap
		for i := range n {
			cm := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lat-%d", i%objects)},
				Data:       map[string]string{"ts": strconv.FormatInt(time.Now().UnixNano(), 10)},
			}
			var err error
			if last, err = cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		return last.ResourceVersion
	}
	phase := func() time.Duration {
		write(events)
		var all []time.Duration
		for _, f := range fast {
			all = append(all, f.take(ctx, t, events)...)
		}
		return p99(all)
	}

	p99Alone := phase()
	heapBefore := d.metric("go_memstats_heap_inuse_bytes")

	// The slow client reads its snapshot, then nothing.
	sc := dialSocket(t, d.socket, reads(configMaps, ns))
	o := opts
	o.ClientName = "slow"
	slow, err := sc.Stream(ctx, o, "")
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	state := map[string]string{}
	received := 0
	apply := func(evs []*informerdv1.Event) {
		for _, ev := range evs {
			received++
			switch ev.GetType() {
			case informerdv1.EventType_EVENT_TYPE_RESET:
				clear(state)
			case informerdv1.EventType_EVENT_TYPE_ADDED, informerdv1.EventType_EVENT_TYPE_MODIFIED:
				obj, _ := decodeUnstructured(ev.GetObject())
				state[ns+"/"+obj.GetName()] = obj.GetResourceVersion()
			case informerdv1.EventType_EVENT_TYPE_DELETED:
				obj, _ := decodeUnstructured(ev.GetObject())
				delete(state, ns+"/"+obj.GetName())
			}
		}
	}
	for len(state) < objects+1 { // + kube-root-ca.crt
		evs, err := slow.Recv()
		if err != nil {
			t.Fatal(err)
		}
		apply(evs)
	}
	received = 0

	p99WithSlow := phase()
	heapAfter := d.metric("go_memstats_heap_inuse_bytes")
	t.Logf("%d events to 5 clients: p99 %s alone, %s with a stalled client; daemon heap in use %.1f MiB before the stall, %.1f MiB with it",
		events, p99Alone, p99WithSlow, heapBefore/(1<<20), heapAfter/(1<<20))
	if growth := heapAfter - heapBefore; growth > 32<<20 {
		t.Errorf("daemon heap grew by %.1f MiB while a client stalled through %d events, want at most 32 MiB", growth/(1<<20), events)
	}

	// The slow client reads again: it converges, from the compacted
	// catch-up, having received far fewer events than were written.
	want := listState(ctx, t, configMaps, ns)
	for !maps.Equal(state, want) {
		evs, err := slow.Recv()
		if err != nil {
			t.Fatal(err)
		}
		apply(evs)
	}
	t.Logf("the stalled client caught up with %d events for %d writes", received, events)
	if received >= events {
		t.Errorf("the stalled client received %d events for %d writes: it was buffered, not caught up", received, events)
	}
}

func decodeUnstructured(b []byte) (*unstructured.Unstructured, error) {
	o := &unstructured.Unstructured{}
	return o, o.UnmarshalJSON(b)
}

package daemon_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/daemon"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"),
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"))
}

// fakeAPIServer serves just enough of the Kubernetes API for one resource
// (configmaps) to drive a real cache.Manager: discovery, an empty LIST, and
// a watch that writes whatever the benchmark feeds it. It stands in for the
// API server only where the API server is not what is measured.
type fakeAPIServer struct {
	*httptest.Server
	feed           chan []byte // watch event lines
	lists, watches atomic.Int32
}

func newFakeAPIServer(t testing.TB) *fakeAPIServer {
	f := &fakeAPIServer{feed: make(chan []byte, 1024)}
	mux := http.NewServeMux()
	reply := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, body)
		}
	}
	mux.HandleFunc("/api", reply(`{"kind":"APIVersions","versions":["v1"]}`))
	mux.HandleFunc("/apis", reply(`{"kind":"APIGroupList","apiVersion":"v1","groups":[]}`))
	mux.HandleFunc("/api/v1", reply(`{"kind":"APIResourceList","groupVersion":"v1","resources":[`+
		`{"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["list","watch"]}]}`))
	mux.HandleFunc("/api/v1/configmaps", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") != "true" {
			f.lists.Add(1)
			io.WriteString(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
			return
		}
		f.watches.Add(1)
		flusher := w.(http.Flusher)
		flusher.Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case line := <-f.feed:
				w.Write(line)
				// Write what is queued before flushing, as the API server does.
				for n := len(f.feed); n > 0; n-- {
					w.Write(<-f.feed)
				}
				flusher.Flush()
			}
		}
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

// event returns a watch line for ConfigMap i at resourceVersion rv with
// about size bytes of data.
func event(i, rv, size int) []byte {
	return []byte(fmt.Sprintf(`{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":`+
		`{"name":"cm-%d","namespace":"bench","uid":"u-%d","resourceVersion":"%d","labels":{"app":"bench"}},"data":{"v":%q}}}`+"\n",
		i, i, rv, strings.Repeat("x", size)))
}

// serve starts a daemon over the fake API server on a Unix socket.
func serve(t testing.TB, api *fakeAPIServer) string {
	socket, _ := serveManager(t, api)
	return socket
}

func serveManager(t testing.TB, api *fakeAPIServer) (string, *cache.Manager) {
	return serveWith(t, api, daemon.Options{})
}

// serveWith is serveManager with the daemon's options (Cache and Logger
// are set here).
func serveWith(t testing.TB, api *fakeAPIServer, opts daemon.Options) (string, *cache.Manager) {
	mgr, err := cache.NewManager(cache.Options{
		Config: &rest.Config{Host: api.URL, QPS: -1}, Scope: cache.ScopeCluster, DisableWatchList: true,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	opts.Cache, opts.Logger = mgr, slog.New(slog.DiscardHandler)
	srv, err := daemon.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(daemon.ServerOptions()...)
	informerdv1.RegisterInformerServiceServer(gs, srv)
	socket := filepath.Join(t.TempDir(), "d.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(l) }()
	t.Cleanup(func() {
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		srv.Shutdown()
		<-stopped
		<-done
		mgr.Close()
	})
	return socket, mgr
}

// subscriber counts the object events it receives on its own connection.
type subscriber struct {
	s      *client.Stream
	synced chan struct{}
	got    chan int // receives the running count after each batch
}

func subscribe(t testing.TB, socket string) *subscriber {
	return subscribeWith(t, socket, false)
}

// subscribeWith subscribes with the client library, or, if raw, with a
// reader that only counts the events in each WatchResponse without
// decoding it, so that what is measured is the daemon's side.
func subscribeWith(t testing.TB, socket string, raw bool) *subscriber {
	if raw {
		return subscribeRaw(t, socket)
	}
	c, err := client.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := c.Stream(context.Background(), client.WatchOptions{
		Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, ClientName: "bench",
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	sub := &subscriber{s: s, synced: make(chan struct{}), got: make(chan int, 1)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ends when the stream is closed
		defer wg.Done()
		n := 0
		for {
			evs, err := s.Recv()
			if err != nil {
				return
			}
			for _, ev := range evs {
				switch ev.GetType() {
				case informerdv1.EventType_EVENT_TYPE_SYNCED:
					close(sub.synced)
				case informerdv1.EventType_EVENT_TYPE_ADDED, informerdv1.EventType_EVENT_TYPE_MODIFIED:
					n++
				}
			}
			select { // keep only the latest count
			case <-sub.got:
			default:
			}
			sub.got <- n
		}
	}()
	t.Cleanup(func() { s.Close(); wg.Wait() })
	return sub
}

func subscribeRaw(t testing.TB, socket string) *subscriber {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, informerdv1.InformerService_Watch_FullMethodName,
		grpc.ForceCodecV2(countingCodec{encoding.GetCodecV2("proto")}))
	if err == nil {
		err = s.SendMsg(&informerdv1.WatchRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, ClientName: "raw"})
	}
	if err == nil {
		err = s.CloseSend()
	}
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	sub := &subscriber{synced: make(chan struct{}), got: make(chan int, 1)}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ends when the stream is cancelled
		defer wg.Done()
		n, synced := 0, false
		for {
			var c eventCount
			if err := s.RecvMsg(&c); err != nil {
				return
			}
			n += c.objects
			if c.synced && !synced {
				synced = true
				close(sub.synced)
			}
			select { // keep only the latest count
			case <-sub.got:
			default:
			}
			sub.got <- n
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return sub
}

// eventCount is what countingCodec reads of a WatchResponse.
type eventCount struct {
	objects int
	synced  bool
}

// countingCodec counts the object events of a WatchResponse by walking
// its wire format, and encodes requests as protobuf.
type countingCodec struct{ encoding.CodecV2 }

func (countingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c := v.(*eventCount)
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	for len(b) > 0 {
		_, _, n := protowire.ConsumeTag(b) // field 1, bytes: one Event
		ev, m := protowire.ConsumeBytes(b[n:])
		if n < 0 || m < 0 {
			return fmt.Errorf("bad WatchResponse")
		}
		b = b[n+m:]
		typ := informerdv1.EventType_EVENT_TYPE_UNSPECIFIED
		if num, wt, k := protowire.ConsumeTag(ev); k > 0 && num == 1 && wt == protowire.VarintType {
			t, _ := protowire.ConsumeVarint(ev[k:])
			typ = informerdv1.EventType(t)
		}
		switch typ {
		case informerdv1.EventType_EVENT_TYPE_SYNCED:
			c.synced = true
		case informerdv1.EventType_EVENT_TYPE_ADDED, informerdv1.EventType_EVENT_TYPE_MODIFIED:
			c.objects++
		}
	}
	return nil
}

// waitCount waits until the subscriber has received n object events.
func (s *subscriber) waitCount(t testing.TB, n int) {
	timeout := time.After(2 * time.Minute)
	for {
		select {
		case got := <-s.got:
			if got >= n {
				return
			}
		case <-timeout:
			t.Fatalf("subscriber stuck before %d events", n)
		}
	}
}

// TestConcurrentSubscribersShareOneUpstream: many clients subscribing and
// leaving the same Key at once never start a second reflector, and the ref
// count returns to zero.
func TestConcurrentSubscribersShareOneUpstream(t *testing.T) {
	api := newFakeAPIServer(t)
	socket, mgr := serveManager(t, api)
	c, err := client.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opts := client.WatchOptions{Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, ClientName: "churn"}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				s, err := c.Stream(context.Background(), opts, "")
				if err != nil {
					errs <- err
					return
				}
				_, err = s.Recv() // the snapshot: the subscription is live
				s.Close()
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Streams end asynchronously on the server, with nothing to wait on:
	// poll for the releases.
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		src := mgr.Sources()
		return len(src) == 1 && src[0].RefCount == 0, nil
	})
	if err != nil {
		t.Fatalf("sources after every client left: %+v", mgr.Sources())
	}
	if l, w := api.lists.Load(), api.watches.Load(); l != 1 || w != 1 {
		t.Fatalf("200 subscriptions caused %d lists and %d watches upstream, want 1 and 1", l, w)
	}
}

// TestFanOutDeliversEveryEventToEverySubscriber checks the path the
// benchmark measures: every subscriber gets every event, in order.
func TestFanOutDeliversEveryEventToEverySubscriber(t *testing.T) {
	api := newFakeAPIServer(t)
	socket := serve(t, api)
	subs := make([]*subscriber, 5)
	for i := range subs {
		subs[i] = subscribe(t, socket)
		<-subs[i].synced
	}
	for i := range 500 {
		api.feed <- event(i%50, i+2, 100)
	}
	for _, s := range subs {
		s.waitCount(t, 500)
	}
}

// BenchmarkFanOut measures events delivered per second from one upstream
// watch to 1 to 1000 subscribers, each on its own gRPC connection over a
// Unix socket: upstream JSON decode, the log, encode-once frames and gRPC.
// reader=client adds the client library's decoding of each WatchResponse;
// reader=raw only counts the events, so that allocs/delivery is the
// daemon's (and gRPC's) cost per event per subscriber.
func BenchmarkFanOut(b *testing.B) {
	for _, reader := range []string{"raw", "client"} {
		for _, n := range []int{1, 10, 100, 1000} {
			for _, size := range []int{1024, 4096} {
				b.Run(fmt.Sprintf("reader=%s/subscribers=%d/object=%dB", reader, n, size), func(b *testing.B) {
					benchmarkFanOut(b, reader == "raw", n, size)
				})
			}
		}
	}
}

func benchmarkFanOut(b *testing.B, raw bool, n, size int) {
	api := newFakeAPIServer(b)
	socket := serve(b, api)
	subs := make([]*subscriber, n)
	for i := range subs {
		subs[i] = subscribeWith(b, socket, raw)
		<-subs[i].synced
	}
	lines := make([][]byte, b.N)
	for i := range lines {
		lines[i] = event(i%1000, i+2, size)
	}
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	start := time.Now()
	go func() { // ends after b.N lines
		for _, l := range lines {
			api.feed <- l
		}
	}()
	for _, s := range subs {
		s.waitCount(b, b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(b.N*n)/elapsed.Seconds(), "deliveries/s")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N*n), "allocs/delivery")
}

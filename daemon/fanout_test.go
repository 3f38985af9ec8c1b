package daemon_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/auth"
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
// a watch that writes whatever the benchmark feeds it (a field selector on
// another field than the name or namespace is rejected with the API
// server's 400); and TokenReviews
// (any token is the ServiceAccount bench/<its "sub" claim>) and
// SubjectAccessReviews (everything is allowed unless a field below denies
// it) for the daemon's authentication. It stands in for the API server only where the API
// server is not what is measured.
type fakeAPIServer struct {
	*httptest.Server
	feed                  chan []byte // watch event lines
	lists, watches        atomic.Int32
	tokenReviews, reviews atomic.Int32
	// deny and fail make SubjectAccessReviews deny, or fail with 500;
	// denyName makes them deny the ServiceAccount of that name only.
	deny, fail atomic.Bool
	denyName   atomic.Value // string
	// denyNonResource holds the users (keys) whose SubjectAccessReviews
	// of non-resource URLs (such as /informerd/informers) are denied.
	denyNonResource sync.Map
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
		`{"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["list","watch"]},`+
		`{"name":"secrets","singularName":"secret","namespaced":true,"kind":"Secret","verbs":["list","watch"]}]}`))
	mux.HandleFunc("/api/v1/configmaps", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if msg := unsupportedField(r.URL.Query().Get("fieldSelector")); msg != "" {
			w.WriteHeader(http.StatusBadRequest)
			writeJSON(w, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Message: msg, Reason: metav1.StatusReasonBadRequest, Code: http.StatusBadRequest})
			return
		}
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
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, r *http.Request) {
		f.tokenReviews.Add(1)
		var tr authenticationv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var claims struct {
			Sub string `json:"sub"`
		}
		part := strings.Split(tr.Spec.Token, ".")[1]
		b, _ := base64.RawURLEncoding.DecodeString(part)
		_ = json.Unmarshal(b, &claims)
		tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:bench:" + claims.Sub, Groups: []string{"system:serviceaccounts"}}}
		if strings.HasPrefix(claims.Sub, "forged") { // signed by no one
			tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
		}
		writeJSON(w, &tr)
	})
	mux.HandleFunc("POST /apis/authorization.k8s.io/v1/subjectaccessreviews", func(w http.ResponseWriter, r *http.Request) {
		f.reviews.Add(1)
		if f.fail.Load() {
			http.Error(w, "etcd is on fire", http.StatusInternalServerError)
			return
		}
		var sar authorizationv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		name, _ := f.denyName.Load().(string)
		_, deniedPath := f.denyNonResource.Load(sar.Spec.User)
		deniedPath = deniedPath && sar.Spec.NonResourceAttributes != nil
		sar.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: !f.deny.Load() && !deniedPath &&
			(name == "" || sar.Spec.User != "system:serviceaccount:bench:"+name)}
		writeJSON(w, &sar)
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

// unsupportedField returns the kube-apiserver's message for a field
// selector on configmaps that names a field other than metadata.name and
// metadata.namespace (apimachinery's DefaultMetaV1FieldSelectorConversion),
// or "".
func unsupportedField(selector string) string {
	sel, err := fields.ParseSelector(selector)
	if err != nil {
		return "invalid field selector: " + err.Error()
	}
	for _, r := range sel.Requirements() {
		if r.Field != "metadata.name" && r.Field != "metadata.namespace" {
			return fmt.Sprintf("%q is not a known field selector: only %q, %q", r.Field, "metadata.name", "metadata.namespace")
		}
	}
	return ""
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// token returns a token the fake API server authenticates as
// system:serviceaccount:bench:<name>, with informerd's audience.
func token(name string) string {
	part := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return part(map[string]string{"alg": "RS256"}) + "." +
		part(map[string]any{"sub": name, "aud": "informerd", "exp": time.Now().Add(time.Hour).Unix()}) + ".c2ln"
}

// event returns a watch line for ConfigMap i at resourceVersion rv with
// about size bytes of data.
func event(i, rv, size int) []byte {
	return []byte(fmt.Sprintf(`{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":`+
		`{"name":"cm-%d","namespace":"bench","uid":"u-%d","resourceVersion":"%d","labels":{"app":"bench"}},"data":{"v":%q}}}`+"\n",
		i, i, rv, strings.Repeat("x", size)))
}

// security is how a test daemon treats its callers.
type security int

const (
	// authOn authenticates every caller with a TokenReview and authorizes
	// every stream with SubjectAccessReviews, as informerd does by default.
	authOn security = iota
	// authOff is -insecure-local-only: no token, no reviews.
	authOff
)

func (s security) String() string { return map[security]string{authOn: "on", authOff: "off"}[s] }

// testServer is a daemon over the fake API server on a Unix socket.
type testServer struct {
	socket string
	tcp    string // its loopback TCP address, if serverConfig.tcp
	mgr    *cache.Manager
	srv    *daemon.Server
	sec    security
}

// serverConfig is what a test may tune of a daemon.
type serverConfig struct {
	opts  daemon.Options
	authn auth.AuthenticatorOptions
	authz auth.AuthorizerOptions
	tcp   bool // serve on a loopback TCP port as well
	// maxObjectBytes and maxSources are the cache's MaxObjectBytes and
	// MaxSources.
	maxObjectBytes, maxSources int
	// health registers the gRPC health service, as cmd/informerd does.
	health bool
}

// serve starts a daemon with sec over the fake API server, with limits
// that admit a benchmark's thousand subscribers from one uid, unless tune
// changes them.
func serve(t testing.TB, api *fakeAPIServer, sec security, tune ...func(*serverConfig)) *testServer {
	cfg := serverConfig{
		opts: daemon.Options{
			Logger: slog.New(slog.DiscardHandler), InsecureLocalOnly: sec == authOff,
			// Without authentication every subscriber is one caller (its uid).
			Limits: daemon.Limits{MaxConnections: 4096, MaxConnectionsPerPeer: 4096, MaxStreamsPerCaller: 4096},
		},
		authn: auth.AuthenticatorOptions{ReviewOptions: auth.ReviewOptions{ReviewsPerSecond: 1e6, ReviewBurst: 1e6}},
	}
	for _, f := range tune {
		f(&cfg)
	}
	mgr, err := cache.NewManager(cache.Options{
		Config: &rest.Config{Host: api.URL, QPS: -1}, Scope: cache.ScopeCluster, DisableWatchList: true,
		MaxObjectBytes: cfg.maxObjectBytes, MaxSources: cfg.maxSources, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.opts.Cache = mgr
	opts := cfg.opts
	if sec == authOn {
		// JSON: the fake API server speaks no protobuf.
		kube := kubernetes.NewForConfigOrDie(&rest.Config{Host: api.URL, QPS: -1, ContentConfig: rest.ContentConfig{ContentType: "application/json"}})
		cfg.authn.Reviews, cfg.authn.Logger = kube.AuthenticationV1().TokenReviews(), opts.Logger
		cfg.authz.Reviews, cfg.authz.Logger = kube.AuthorizationV1().SubjectAccessReviews(), opts.Logger
		if opts.Authenticator, err = auth.NewAuthenticator(cfg.authn); err != nil {
			t.Fatal(err)
		}
		if opts.Authorizer, err = auth.NewAuthorizer(cfg.authz); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := daemon.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(srv.ServerOptions()...)
	informerdv1.RegisterInformerServiceServer(gs, srv)
	if cfg.health {
		healthpb.RegisterHealthServer(gs, health.NewServer())
	}
	ts := &testServer{socket: filepath.Join(t.TempDir(), "d.sock"), mgr: mgr, srv: srv, sec: sec}
	l, err := net.Listen("unix", ts.socket)
	if err != nil {
		t.Fatal(err)
	}
	ls := []net.Listener{l}
	if cfg.tcp {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ts.tcp = l.Addr().String()
		ls = append(ls, l)
	}
	var served sync.WaitGroup
	for _, l := range ls {
		served.Add(1)
		go func() { defer served.Done(); _ = gs.Serve(srv.Listen(l)) }()
	}
	t.Cleanup(func() {
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		srv.Shutdown()
		<-stopped
		served.Wait()
		mgr.Close()
	})
	return ts
}

// credentials returns the dial options of the client named name: its own
// token on a secure daemon.
func (s *testServer) credentials(name string) []grpc.DialOption {
	if s.sec == authOff {
		return nil
	}
	return []grpc.DialOption{client.WithToken(token(name))}
}

// dial connects as the client named name.
func (s *testServer) dial(t testing.TB, name string) *client.Client {
	c, err := client.Dial(s.socket, s.credentials(name)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// subscriber counts the object events it receives on its own connection.
type subscriber struct {
	s      *client.Stream
	synced chan struct{}
	got    chan int      // receives the running count after each batch
	ended  chan struct{} // closed when the stream ends, after err is set
	err    error
}

// waitSynced waits for the subscriber's SYNCED, failing if its stream ends
// first.
func (s *subscriber) waitSynced(t testing.TB) {
	select {
	case <-s.synced:
	case <-s.ended:
		t.Fatalf("stream ended before SYNCED: %v", s.err)
	}
}

func subscribe(t testing.TB, srv *testServer, name string) *subscriber {
	return subscribeWith(t, srv, name, false)
}

// subscribeWith subscribes with the client library, or, if raw, with a
// reader that only counts the events in each WatchResponse without
// decoding it, so that what is measured is the daemon's side.
func subscribeWith(t testing.TB, srv *testServer, name string, raw bool) *subscriber {
	if raw {
		return subscribeRaw(t, srv, name)
	}
	s, err := srv.dial(t, name).Stream(context.Background(), client.WatchOptions{
		Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, ClientName: "bench",
	}, "")
	if err != nil {
		t.Fatal(err)
	}
	sub := &subscriber{s: s, synced: make(chan struct{}), got: make(chan int, 1), ended: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ends when the stream is closed
		defer wg.Done()
		defer close(sub.ended)
		n := 0
		for {
			evs, err := s.Recv()
			if err != nil {
				sub.err = err
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

func subscribeRaw(t testing.TB, srv *testServer, name string) *subscriber {
	conn, err := grpc.NewClient("unix://"+srv.socket, append(srv.credentials(name), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
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
	sub := &subscriber{synced: make(chan struct{}), got: make(chan int, 1), ended: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ends when the stream is cancelled
		defer wg.Done()
		defer close(sub.ended)
		n, synced := 0, false
		for {
			var c eventCount
			if err := s.RecvMsg(&c); err != nil {
				sub.err = err
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
		case <-s.ended:
			t.Fatalf("stream ended before %d events: %v", n, s.err)
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
	srv := serve(t, api, authOn)
	c := srv.dial(t, "churn")
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
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		src := srv.mgr.Sources()
		return len(src) == 1 && src[0].RefCount == 0, nil
	})
	if err != nil {
		t.Fatalf("sources after every client left: %+v", srv.mgr.Sources())
	}
	if l, w := api.lists.Load(), api.watches.Load(); l != 1 || w != 1 {
		t.Fatalf("200 subscriptions caused %d lists and %d watches upstream, want 1 and 1", l, w)
	}
	// One caller, one token, one resource: one TokenReview, and one
	// SubjectAccessReview per verb (list, watch), however many streams.
	if tr, sar := api.tokenReviews.Load(), api.reviews.Load(); tr != 1 || sar != 2 {
		t.Fatalf("200 subscriptions by one caller caused %d TokenReviews and %d SubjectAccessReviews, want 1 and 2", tr, sar)
	}
}

// TestFanOutDeliversEveryEventToEverySubscriber checks the path the
// benchmark measures: every subscriber gets every event, in order.
func TestFanOutDeliversEveryEventToEverySubscriber(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn)
	subs := make([]*subscriber, 5)
	for i := range subs {
		subs[i] = subscribe(t, srv, fmt.Sprintf("client-%d", i))
		subs[i].waitSynced(t)
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
// Unix socket with its own identity: upstream JSON decode, the log,
// encode-once frames and gRPC. reader=client adds the client library's
// decoding of each WatchResponse; reader=raw only counts the events, so
// that allocs/delivery is the daemon's (and gRPC's) cost per event per
// subscriber. auth=on authenticates and authorizes every subscriber (its
// reviews are made before the timer starts); auth=off is
// -insecure-local-only.
func BenchmarkFanOut(b *testing.B) {
	for _, reader := range []string{"raw", "client"} {
		for _, n := range []int{1, 10, 100, 1000} {
			for _, size := range []int{1024, 4096} {
				for _, sec := range []security{authOn, authOff} {
					b.Run(fmt.Sprintf("reader=%s/subscribers=%d/object=%dB/auth=%s", reader, n, size, sec), func(b *testing.B) {
						benchmarkFanOut(b, reader == "raw", n, size, sec)
					})
				}
			}
		}
	}
}

func benchmarkFanOut(b *testing.B, raw bool, n, size int, sec security) {
	api := newFakeAPIServer(b)
	srv := serve(b, api, sec)
	subs := make([]*subscriber, n)
	for i := range subs {
		subs[i] = subscribeWith(b, srv, fmt.Sprintf("client-%d", i), raw)
		subs[i].waitSynced(b)
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

// BenchmarkSubscribe measures the latency of a subscription to an informer
// that has already synced: from the Watch request to its SYNCED, over a
// connection already open, with authentication and authorization on (the
// caller's token and decisions cached, as for any caller after its first
// stream) and off. It reports the median and 99th percentile.
func BenchmarkSubscribe(b *testing.B) {
	for _, sec := range []security{authOn, authOff} {
		b.Run("auth="+sec.String(), func(b *testing.B) {
			api := newFakeAPIServer(b)
			srv := serve(b, api, sec)
			subscribe(b, srv, "holder").waitSynced(b) // keeps the informer synced
			c := srv.dial(b, "subscriber")
			opts := client.WatchOptions{Resource: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, ClientName: "subscriber"}
			once := func() time.Duration {
				start := time.Now()
				s, err := c.Stream(context.Background(), opts, "")
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				for {
					evs, err := s.Recv()
					if err != nil {
						b.Fatal(err)
					}
					for _, ev := range evs {
						if ev.GetType() == informerdv1.EventType_EVENT_TYPE_SYNCED {
							return time.Since(start)
						}
					}
				}
			}
			once() // warms the caches (and the connection)
			reviewsBefore := api.tokenReviews.Load() + api.reviews.Load()
			lat := make([]time.Duration, b.N)
			b.ResetTimer()
			for i := range lat {
				lat[i] = once()
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(api.tokenReviews.Load()+api.reviews.Load()-reviewsBefore)/float64(b.N), "reviews/op")
		})
	}
}

// BenchmarkSubscriberHeap measures the heap one more subscriber costs, on
// its own connection with one stream (both ends: the daemon and a raw
// reader in this process), with authentication and authorization on
// (its token, decisions and re-check kept) and off. Run it with a fixed
// count: -benchtime 200x.
func BenchmarkSubscriberHeap(b *testing.B) {
	for _, sec := range []security{authOn, authOff} {
		b.Run("auth="+sec.String(), func(b *testing.B) {
			api := newFakeAPIServer(b)
			srv := serve(b, api, sec)
			subscribeWith(b, srv, "warm", true).waitSynced(b)
			heap := func() uint64 {
				var m runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m)
				return m.HeapAlloc
			}
			before := heap()
			b.ResetTimer()
			for i := range b.N {
				subscribeWith(b, srv, fmt.Sprintf("client-%d", i), true).waitSynced(b)
			}
			b.StopTimer()
			b.ReportMetric(float64(int64(heap())-int64(before))/float64(b.N), "heap-B/subscriber")
		})
	}
}

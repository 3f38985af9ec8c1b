package wrapconfig

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestParseReadBooleansAsTheAPIServer: every value of a boolean parameter
// but absent, "0" and "false" (in any case) is true, as apimachinery's
// Convert_Slice_string_To_bool reads it.
func TestParseReadBooleansAsTheAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name, query       string
		watch, bookmarks  bool
		sendInitialEvents string // "", "true", "false"
		passed            string // the reason it is passed through; "" if served
	}{
		{"absent", "", false, false, "", ""},
		{"bare watch", "watch", true, false, "", ""},
		{"watch=f", "watch=f", true, false, "", ""},
		{"watch=no", "watch=no", true, false, "", ""},
		{"watch=1", "watch=1", true, false, "", ""},
		{"watch=0", "watch=0", false, false, "", ""},
		{"watch=false", "watch=false", false, false, "", ""},
		{"watch=FALSE", "watch=FALSE", false, false, "", ""},
		{"watch=False", "watch=False", false, false, "", ""},
		{"allowWatchBookmarks=f", "watch=true&allowWatchBookmarks=f", true, true, "", ""},
		{"allowWatchBookmarks=0", "watch=true&allowWatchBookmarks=0", true, false, "", ""},
		{"sendInitialEvents=f is true", "watch=1&sendInitialEvents=f&allowWatchBookmarks=t&resourceVersionMatch=NotOlderThan", true, true, "true", ""},
		{"sendInitialEvents=f without what WatchList needs", "watch=1&sendInitialEvents=f", false, false, "", reasonParameter},
		{"sendInitialEvents=0", "watch=1&sendInitialEvents=0", true, false, "false", ""},
		{"a list with allowWatchBookmarks=0", "allowWatchBookmarks=0", false, false, "", reasonParameter},
		{"a repeated parameter", "watch=1&watch=0", false, false, "", reasonParameter},
		{"timeoutSeconds not a number", "watch=1&timeoutSeconds=x", false, false, "", reasonParameter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/api/v1/pods?"+tc.query, nil)
			r, reason := parseRead(req)
			if reason != tc.passed {
				t.Fatalf("passed for %q, want %q", reason, tc.passed)
			}
			if r == nil {
				return
			}
			sie := ""
			if r.sendInitialEvents != nil {
				sie = map[bool]string{true: "true", false: "false"}[*r.sendInitialEvents]
			}
			if r.watch != tc.watch || r.allowBookmarks != tc.bookmarks || sie != tc.sendInitialEvents {
				t.Errorf("watch %v bookmarks %v sendInitialEvents %q, want %v %v %q", r.watch, r.allowBookmarks, sie, tc.watch, tc.bookmarks, tc.sendInitialEvents)
			}
		})
	}
}

// TestParseReadPathsAsTheAPIServer: only clean paths are collections'; the
// API server answers 404 for //api/v1/pods, and the wrapper passes it on.
func TestParseReadPathsAsTheAPIServer(t *testing.T) {
	for _, tc := range []struct {
		name, target string
		served       bool
	}{
		{"clean", "/api/v1/namespaces/ns/pods", true},
		{"leading double slash", "//api/v1/namespaces/ns/pods", false},
		{"inner double slash", "/api/v1//namespaces/ns/pods", false},
		{"trailing slash", "/api/v1/namespaces/ns/pods/", false},
		{"dot", "/api/v1/namespaces/ns/./pods", false},
		{"dot dot", "/api/v1/namespaces/other/../ns/pods", false},
		{"escaped slash", "/api/v1/namespaces/ns%2Fx/pods", false},
		{"group", "/apis/apps/v1/deployments", true},
		{"group, double slash", "/apis//apps/v1/deployments", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tc.target, nil)
			r, reason := parseRead(req)
			if (r != nil) != tc.served || (!tc.served && reason != reasonNotList) {
				t.Errorf("served %v (passed for %q), want served %v", r != nil, reason, tc.served)
			}
		})
	}
}

// TestWrapImpersonationPassesThrough: a config that impersonates reads as
// the impersonated user at the API server, never as the daemon's token;
// Strict refuses it, saying why.
func TestWrapImpersonationPassesThrough(t *testing.T) {
	for _, tc := range []struct {
		name        string
		impersonate rest.ImpersonationConfig
		header      string
	}{
		{"user", rest.ImpersonationConfig{UserName: "jane"}, ""},
		{"uid and groups", rest.ImpersonationConfig{UserName: "jane", UID: "1", Groups: []string{"g"}}, ""},
		{"a header of the caller's own", rest.ImpersonationConfig{}, "Impersonate-Extra-Scopes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{})
			f.daemon.set(nil, marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "5"))
			cfg := rest.CopyConfig(f.cfg)
			cfg.Impersonate = tc.impersonate
			cs := kubernetes.NewForConfigOrDie(cfg)
			req := cs.CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/ns/pods")
			if tc.header != "" {
				req.SetHeader(tc.header, "x")
			}
			if _, err := req.DoRaw(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := f.api.got(); len(got) != 1 || got[0] != "GET /api/v1/namespaces/ns/pods" {
				t.Errorf("the API server got %v, want the list", got)
			}
			if got := f.count(outcomePassed, reasonImpersonate); got != 1 {
				t.Errorf("passed for impersonation: %v, want 1", got)
			}

			strict := newWrapFixture(t, Options{Strict: true})
			cfg = rest.CopyConfig(strict.cfg)
			cfg.Impersonate = rest.ImpersonationConfig{UserName: "jane"}
			_, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("ns").List(context.Background(), metav1.ListOptions{})
			if !errors.Is(err, ErrNotServed) || !strings.Contains(err.Error(), "impersonated user") {
				t.Errorf("strict: %v, want ErrNotServed saying why", err)
			}
			if got := strict.api.got(); len(got) != 0 {
				t.Errorf("strict: the API server got %v", got)
			}
		})
	}
}

// TestWrapBookmarkBeforeTimeout: with allowWatchBookmarks, a watch that
// timeoutSeconds ends gets a bookmark at its newest position 2s before,
// as from the API server's watch cache; without, none.
func TestWrapBookmarkBeforeTimeout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		bookmarks bool
	}{
		{"allowWatchBookmarks", true},
		{"no bookmarks", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{})
			f.daemon.set(nil, podEvent(t, informerdv1.EventType_EVENT_TYPE_MODIFIED, testPod("a", "21"), false))
			start := time.Now()
			w, err := f.clientset(t, "application/json").CoreV1().Pods("ns").Watch(context.Background(),
				metav1.ListOptions{ResourceVersion: "20", AllowWatchBookmarks: tc.bookmarks, TimeoutSeconds: new(int64(3))})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			if ev := recv(t, w); ev.Type != watch.Modified {
				t.Fatalf("first event %s, want MODIFIED", ev.Type)
			}
			var got []watch.Event
			for ev := range w.ResultChan() {
				got = append(got, ev)
			}
			elapsed := time.Since(start)
			if elapsed < 3*time.Second || elapsed > 5*time.Second {
				t.Errorf("the watch ended after %v, want timeoutSeconds' 3s", elapsed)
			}
			switch {
			case !tc.bookmarks && len(got) != 0:
				t.Errorf("events %v, want none", got)
			case tc.bookmarks && (len(got) != 1 || got[0].Type != watch.Bookmark || got[0].Object.(*corev1.Pod).ResourceVersion != "21"):
				t.Errorf("events %v, want one bookmark at 21", got)
			}
		})
	}
}

// TestWrapResumeLostPassesThrough: a watch from a resourceVersion the
// daemon no longer holds goes to the API server, which may still serve it
// (a young cluster's RV 1) or answers 410 itself; Strict answers 410 with
// the API server's text.
func TestWrapResumeLostPassesThrough(t *testing.T) {
	script := []*informerdv1.Event{{Type: informerdv1.EventType_EVENT_TYPE_RESET},
		podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, testPod("a", "40"), false),
		marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "41")}
	f := newWrapFixture(t, Options{})
	f.daemon.set(nil, script...)
	w, err := f.clientset(t, "application/json").CoreV1().Pods("ns").Watch(context.Background(), metav1.ListOptions{ResourceVersion: "1"})
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	if got := f.api.got(); len(got) != 1 || got[0] != "GET /api/v1/namespaces/ns/pods?resourceVersion=1&watch=true" {
		t.Errorf("the API server got %v, want the watch", got)
	}
	if got := f.count(outcomePassed, reasonResumeLost); got != 1 {
		t.Errorf("passed for resume_lost: %v, want 1", got)
	}

	strict := newWrapFixture(t, Options{Strict: true})
	strict.daemon.set(nil, script...)
	w, err = strict.clientset(t, "application/json").CoreV1().Pods("ns").Watch(context.Background(), metav1.ListOptions{ResourceVersion: "1"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ev := recv(t, w)
	if st, ok := ev.Object.(*metav1.Status); ev.Type != watch.Error || !ok || !apierrors.IsResourceExpired(apierrors.FromObject(st)) ||
		st.Message != "too old resource version: 1 (41)" {
		t.Fatalf("strict: %s %#v, want ERROR 410 too old resource version: 1 (41)", ev.Type, ev.Object)
	}
}

// TestWrapWatchesEndWithoutLeaks: 100 watches, half ended by
// timeoutSeconds and half closed by the caller, leave no goroutine and no
// stream behind.
func TestWrapWatchesEndWithoutLeaks(t *testing.T) {
	f := newWrapFixture(t, Options{})
	f.daemon.set(nil, podEvent(t, informerdv1.EventType_EVENT_TYPE_MODIFIED, testPod("a", "21"), false))
	cs := f.clientset(t, "application/json")
	ctx := context.Background()
	watchOnce := func(timeout bool) error {
		opts := metav1.ListOptions{ResourceVersion: "20", AllowWatchBookmarks: true}
		if timeout {
			opts.TimeoutSeconds = new(int64(1))
		}
		w, err := cs.CoreV1().Pods("ns").Watch(ctx, opts)
		if err != nil {
			return err
		}
		if ev := <-w.ResultChan(); ev.Type != watch.Modified {
			w.Stop()
			return errors.New("first event " + string(ev.Type))
		}
		if !timeout {
			w.Stop()
		}
		for range w.ResultChan() { // until it ends
		}
		return nil
	}
	if err := watchOnce(false); err != nil { // connections up
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	opt := goleak.IgnoreCurrent()
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for i := range 100 {
		wg.Go(func() { errs <- watchOnce(i%2 == 0) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	goleak.VerifyNone(t, opt)
	t.Logf("goroutines: %d before 100 watches, %d after", before, runtime.NumGoroutine())
}

// TestWrapReflectorTimeoutsLeakNothing (issue 28): client-go reflectors
// over a wrapped config, whose every watch ends at its timeoutSeconds and
// is made again from where it was, as the reflector does every 5-10
// minutes per informer, leave no goroutine behind after 100 watches.
func TestWrapReflectorTimeoutsLeakNothing(t *testing.T) {
	f := newWrapFixture(t, Options{})
	f.daemon.set(nil, podEvent(t, informerdv1.EventType_EVENT_TYPE_ADDED, testPod("a", "21"), false), marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "21"))
	cs := f.clientset(t, "application/json")
	if _, err := cs.CoreV1().Pods("ns").List(context.Background(), metav1.ListOptions{}); err != nil { // connections up
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	opt := goleak.IgnoreCurrent()
	const reflectors, watchesEach = 10, 10
	var watches, lists atomic.Int32
	start := time.Now()
	var wg sync.WaitGroup
	for range reflectors {
		ctx, stop := context.WithCancel(context.Background())
		var mine atomic.Int32
		lw := &toolscache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (k8sruntime.Object, error) {
				lists.Add(1)
				return cs.CoreV1().Pods("ns").List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				if mine.Add(1) > watchesEach {
					stop()
				}
				watches.Add(1)
				// Quiet, and over a second: not a "very short watch",
				// which the reflector would back off after.
				o.TimeoutSeconds = new(int64(2))
				return cs.CoreV1().Pods("ns").Watch(ctx, o)
			},
		}
		r := toolscache.NewReflectorWithOptions(lw, &corev1.Pod{}, toolscache.NewStore(toolscache.MetaNamespaceKeyFunc), toolscache.ReflectorOptions{})
		wg.Go(func() { r.RunWithContext(ctx) })
	}
	wg.Wait()
	if n := watches.Load(); n < reflectors*watchesEach {
		t.Fatalf("%d watches, want at least %d", n, reflectors*watchesEach)
	}
	goleak.VerifyNone(t, opt)
	t.Logf("goroutines: %d before %d reflectors' %d lists and %d watches in %s, %d after", before, reflectors, lists.Load(), watches.Load(), time.Since(start).Round(time.Millisecond), runtime.NumGoroutine())
}

// TestWrapListAtAFutureResourceVersion: a list at a resourceVersion the
// daemon's informer has not reached in its wait gets the API server's own
// 504 (with Retry-After), as its watch cache answers after the same wait,
// instead of a second wait at the API server; a floor of the wrapper's own
// that was not reached still falls back.
func TestWrapListAtAFutureResourceVersion(t *testing.T) {
	tooNew := func(want string) error {
		return withReason(codes.Unavailable, informerdv1.ReasonTooNew, map[string]string{
			informerdv1.MetadataWantResourceVersion: want, informerdv1.MetadataCurrentResourceVersion: "50"})
	}
	for _, tc := range []struct {
		name    string
		refuse  error
		strict  bool
		want504 bool
	}{
		{"the caller's resourceVersion", tooNew("100"), false, true},
		{"the caller's resourceVersion, strict", tooNew("100"), true, true},
		{"another floor", tooNew("120"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{Strict: tc.strict})
			f.daemon.set(tc.refuse)
			res := f.clientset(t, "application/json").CoreV1().RESTClient().Get().AbsPath("/api/v1/namespaces/ns/pods").
				Param("resourceVersion", "100").MaxRetries(0).Do(context.Background()) // client-go retries after Retry-After, as from the API server
			err := res.Error()
			var code int
			res.StatusCode(&code)
			if !tc.want504 {
				if err != nil || len(f.api.got()) != 1 {
					t.Fatalf("%v; the API server got %v: want the list passed through", err, f.api.got())
				}
				return
			}
			var se *apierrors.StatusError
			if !errors.As(err, &se) || code != http.StatusGatewayTimeout || !apierrors.IsTimeout(err) ||
				se.ErrStatus.Message != "Timeout: Too large resource version: 100, current: 50" ||
				se.ErrStatus.Details == nil || se.ErrStatus.Details.RetryAfterSeconds != 1 ||
				len(se.ErrStatus.Details.Causes) != 1 || se.ErrStatus.Details.Causes[0].Type != metav1.CauseTypeResourceVersionTooLarge {
				t.Fatalf("%d %v, want the API server's 504 Too large resource version", code, err)
			}
			if got := f.api.got(); len(got) != 0 {
				t.Errorf("the API server got %v", got)
			}
		})
	}
}

// TestWrapOneOffReadsStartNoInformer: a list with a field selector, and
// a watch of one object, ask the daemon for an existing informer only
// and, when it has none, go to the API server (kubectl describe's per-uid
// events list, kubectl get NAME -w); a watch with another selector (a
// node agent's) starts one; Strict always does.
func TestWrapOneOffReadsStartNoInformer(t *testing.T) {
	noInformer := status.Error(codes.FailedPrecondition, "no informer")
	for _, tc := range []struct {
		name         string
		strict       bool
		watch        bool
		field        string
		existingOnly bool
	}{
		{"a list with a field selector", false, false, "involvedObject.uid=1", true},
		{"a list without", false, false, "", false},
		{"a watch with a field selector", false, true, "spec.nodeName=n", false},
		{"a watch of one object", false, true, "metadata.name=p", true},
		{"strict: a watch of one object", true, true, "metadata.name=p", false},
		{"strict: a list with a field selector", true, false, "involvedObject.uid=1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{Strict: tc.strict})
			f.daemon.set(noInformer)
			opts := metav1.ListOptions{FieldSelector: tc.field, ResourceVersion: "0"}
			var err error
			if tc.watch {
				var w watch.Interface
				if w, err = f.clientset(t, "application/json").CoreV1().Pods("ns").Watch(context.Background(), opts); err == nil {
					w.Stop()
				}
			} else {
				_, err = f.clientset(t, "application/json").CoreV1().Pods("ns").List(context.Background(), opts)
			}
			if got := f.daemon.lastRequest(t).GetExistingInformerOnly(); got != tc.existingOnly {
				t.Errorf("existing_informer_only %v, want %v", got, tc.existingOnly)
			}
			if tc.existingOnly {
				if err != nil || len(f.api.got()) != 1 || f.count(outcomePassed, reasonOneOff) != 1 {
					t.Errorf("%v; the API server got %v: want the read passed through as one_off", err, f.api.got())
				}
			}
		})
	}
}

// TestWrapNewInformerPassesThroughHolding (issue 28): a watch that
// started the daemon's informer, after its resume point (the daemon
// restarted; a field-selector reflector's list went to the API server),
// is served by the API server, never a 410 it would not send; the daemon's
// stream stays open beside it, holding that informer for the reflector's
// next watch, and ends with it.
func TestWrapNewInformerPassesThroughHolding(t *testing.T) {
	f := newWrapFixture(t, Options{})
	left := make(chan struct{})
	f.daemon.mu.Lock()
	f.daemon.reset, f.daemon.left = informerdv1.ResetNewInformer, left
	f.daemon.mu.Unlock()
	f.daemon.set(nil, &informerdv1.Event{Type: informerdv1.EventType_EVENT_TYPE_RESET}, marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "41"))
	hc, err := rest.HTTPClientFor(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	const path = "/api/v1/namespaces/ns/pods?fieldSelector=spec.nodeName%3Dn&resourceVersion=7&watch=true"
	resp, err := hc.Get(f.cfg.Host + path)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.api.got(); !slices.Equal(got, []string{"GET " + path}) || f.count(outcomePassed, reasonResumeNew) != 1 {
		t.Errorf("the API server got %v (%v passed as %s), want the watch", got, f.count(outcomePassed, reasonResumeNew), reasonResumeNew)
	}
	if got := f.daemon.lastRequest(t).GetResumeResourceVersion(); got != "7" {
		t.Errorf("the daemon's stream resumes from %q, want 7", got)
	}
	select {
	case <-left:
		t.Fatal("the daemon's stream ended while the passed-through watch was open")
	case <-time.After(200 * time.Millisecond):
	}
	_ = resp.Body.Close()
	<-left // the stream ends with the watch
}

// TestWrapNoBookmarkWithoutProgress: as the API server's watch cache, no
// bookmark is sent at the position the watch started from, before
// timeoutSeconds or from the daemon (checked against the real one in
// test/e2e).
func TestWrapNoBookmarkWithoutProgress(t *testing.T) {
	f := newWrapFixture(t, Options{})
	f.daemon.set(nil, marker(informerdv1.EventType_EVENT_TYPE_BOOKMARK, "20"))
	w, err := f.clientset(t, "application/json").CoreV1().Pods("ns").Watch(context.Background(),
		metav1.ListOptions{ResourceVersion: "20", AllowWatchBookmarks: true, TimeoutSeconds: new(int64(3))})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var got []watch.EventType
	for ev := range w.ResultChan() {
		if p, ok := ev.Object.(*corev1.Pod); !ok || p.ResourceVersion != "20" {
			t.Errorf("%s %#v", ev.Type, ev.Object)
		}
		got = append(got, ev.Type)
	}
	if len(got) != 0 { // not even the daemon's own, at the start
		t.Errorf("events %v, want none", got)
	}
}

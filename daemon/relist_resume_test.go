package daemon_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/internal/resumetest"
)

// relistAPIServer serves configmaps from a state the test sets: a LIST
// returns it, a watch writes the lines the test feeds and ends after an
// ERROR line (as the API server ends a watch with 410 Gone).
type relistAPIServer struct {
	*httptest.Server
	feed chan string

	mu    sync.Mutex // guards list
	list  string     // the body of a LIST
	lists int
}

// cmJSON is a ConfigMap in ns with a uid and resourceVersion.
func cmJSON(name, uid, rv string) string {
	return fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":"ns","uid":%q,"resourceVersion":%q}}`, name, uid, rv)
}

// setList sets what a LIST returns: "name/uid@rv" objects at rv.
func (a *relistAPIServer) setList(rv string, objs ...string) {
	var items []string
	for _, o := range objs {
		name, rest, _ := strings.Cut(o, "/")
		uid, orv, _ := strings.Cut(rest, "@")
		items = append(items, cmJSON(name, uid, orv))
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.list = fmt.Sprintf(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":%q},"items":[%s]}`, rv, strings.Join(items, ","))
}

func (a *relistAPIServer) listed() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lists
}

func newRelistAPIServer(t *testing.T) *relistAPIServer {
	a := &relistAPIServer{feed: make(chan string, 16)}
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
			a.mu.Lock()
			a.lists++
			body := a.list
			a.mu.Unlock()
			io.WriteString(w, body)
			return
		}
		w.(http.Flusher).Flush()
		for {
			select {
			case <-r.Context().Done():
				return
			case line := <-a.feed:
				io.WriteString(w, line+"\n")
				w.(http.Flusher).Flush()
				if strings.Contains(line, `"type":"ERROR"`) {
					return
				}
			}
		}
	})
	a.Server = httptest.NewServer(mux)
	t.Cleanup(a.Close)
	return a
}

// holdings renders a store as name -> uid@resourceVersion.
func holdings(objs []any) map[string]string {
	out := map[string]string{}
	for _, o := range objs {
		u := o.(*unstructured.Unstructured)
		out[u.GetName()] = string(u.GetUID()) + "@" + u.GetResourceVersion()
	}
	return out
}

// TestResumeInsideARelistDifferenceAsClientsDo (issue 28): clients whose
// connection breaks at every point of the difference a relist publishes
// end with the API server's state, by each rule a real client resumes
// with: client.Watcher (the last event position), the client-go adapters
// (a stream resumed by the adapter from the last object's
// resourceVersion) and client-go's reflector (a watch it starts again from
// the last object's resourceVersion), with no relist of theirs.
func TestResumeInsideARelistDifferenceAsClientsDo(t *testing.T) {
	api := newRelistAPIServer(t)
	api.setList("5", "a/a1@1", "b/b1@2", "c/c1@3", "e/e1@4", "f/f1@5", "g/g1@5")
	srv := serve(t, &fakeAPIServer{Server: api.Server}, authOff)
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// The difference, in snapdiff's order: DELETED c, e, f; ADDED d@8,
	// MODIFIED b@9, ADDED e@10 (created again), MODIFIED g@12 (at the
	// list's own resourceVersion); BOOKMARK @12.
	const diffObjects = 7
	type clientUnderTest struct {
		name   string
		store  func() []any
		synced func() bool
		sawZ   chan struct{}
		// lists counts an informer's requests for an initial state,
		// resets a Watcher's RESETs.
		lists  func() int
		resets func() int64
		broke  func() bool
	}
	var clients []*clientUnderTest
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	signalZ := func(c *clientUnderTest) func(any) {
		return func(obj any) {
			if u, ok := obj.(*unstructured.Unstructured); ok && u.GetName() == "z" {
				select {
				case c.sawZ <- struct{}{}:
				default:
				}
			}
		}
	}
	for k := 1; k <= diffObjects; k++ {
		// client.Watcher: breaks inside its stream.
		{
			b := &resumetest.Breaker{K: k}
			c := &clientUnderTest{name: fmt.Sprintf("Watcher broken after event %d", k), sawZ: make(chan struct{}, 1), broke: b.Broke}
			cl, err := client.Dial(srv.socket, b.DialOption())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cl.Close() })
			w := client.NewWatcher(cl, client.WatchOptions{Resource: gvr}, toolscache.ResourceEventHandlerFuncs{AddFunc: signalZ(c)}, client.WatcherOptions{})
			c.store, c.synced, c.resets = w.Indexer().List, w.HasSynced, w.Resets
			wg.Add(1)
			go func() { defer wg.Done(); _ = w.Run(ctx) }()
			clients = append(clients, c)
		}
		// An informer whose adapter's stream breaks, and one whose
		// reflector's watch ends.
		for _, reflector := range []bool{false, true} {
			b := &resumetest.Breaker{K: k}
			var opts []grpc.DialOption
			name := fmt.Sprintf("adapter's stream broken after event %d", k)
			if !reflector {
				opts = append(opts, b.DialOption())
			} else {
				name = fmt.Sprintf("reflector's watch ended after event %d", k)
			}
			cl, err := client.Dial(srv.socket, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cl.Close() })
			lw := &resumetest.BreakingLW{ListerWatcher: client.NewListerWatcher(cl, client.WatchOptions{Resource: gvr})}
			if reflector {
				lw.Breaker = b
			}
			c := &clientUnderTest{name: name, sawZ: make(chan struct{}, 1), lists: lw.Initial, broke: b.Broke}
			inf := toolscache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, toolscache.Indexers{})
			if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: signalZ(c)}); err != nil {
				t.Fatal(err)
			}
			c.store, c.synced = inf.GetStore().List, inf.HasSynced
			wg.Add(1)
			go func() { defer wg.Done(); inf.RunWithContext(ctx) }()
			clients = append(clients, c)
		}
	}
	for _, c := range clients {
		if !toolscache.WaitForCacheSync(ctx.Done(), c.synced) {
			t.Fatalf("%s never synced", c.name)
		}
	}
	lists := api.listed()

	// H = 6, then 410 Gone: the daemon relists at 12 and publishes the
	// difference; then z, which every client waits for.
	api.feed <- `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"6"}}}`
	api.setList("12", "a/a1@1", "b/b1@9", "d/d1@8", "e/e2@10", "g/g1@12")
	api.feed <- `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410,"message":"too old resource version: 5 (6)"}}`
	api.feed <- `{"type":"ADDED","object":` + cmJSON("z", "z1", "20") + `}`

	want := map[string]string{"a": "a1@1", "b": "b1@9", "d": "d1@8", "e": "e2@10", "g": "g1@12", "z": "z1@20"}
	for _, c := range clients {
		select {
		case <-c.sawZ:
		case <-ctx.Done():
			t.Fatalf("%s never received z; it holds %v", c.name, holdings(c.store()))
		}
		if got := holdings(c.store()); !maps.Equal(got, want) {
			t.Errorf("%s holds %v, want %v", c.name, got, want)
		}
		if !c.broke() {
			t.Errorf("%s: the break did not happen", c.name)
		}
		if c.lists != nil && c.lists() != 1 {
			t.Errorf("%s asked for an initial state %d times, want once (no relist)", c.name, c.lists())
		}
		if c.resets != nil && c.resets() != 0 {
			t.Errorf("%s had %d RESETs, want none", c.name, c.resets())
		}
	}
	if n := api.listed() - lists; n != 1 {
		t.Errorf("the API server served %d LISTs after the clients synced, want 1 (the daemon's relist)", n)
	}
}

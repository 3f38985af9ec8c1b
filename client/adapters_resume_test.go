package client

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestListerWatcherResumesWithTheRotatedToken (issue 28): a watch whose
// stream ends UNAUTHENTICATED at its token's expiry resumes where it was
// with the token file's rotated token, rather than reporting a 401 on
// which client-go's reflector relists.
func TestListerWatcherResumesWithTheRotatedToken(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeToken := func(tok string) {
		tmp := tokenFile + ".new"
		if err := os.WriteFile(tmp, []byte(tok), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Rename(tmp, tokenFile); err != nil { // as the kubelet swaps the file
			t.Error(err)
		}
	}
	writeToken("first-token")
	d := (&scriptedDaemon{}).
		then(nil, cm("a", "3"), ev(synced, "", "5")).
		then(status.Error(codes.Unauthenticated, "informerd: the token expired at 12:00:00"), ev(modified, "a", "6")).
		then(nil, ev(modified, "a", "7"))
	var mu sync.Mutex // guards tokens
	var tokens []string
	record := grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		md, _ := metadata.FromIncomingContext(ss.Context())
		mu.Lock()
		tokens = append(tokens, md.Get("authorization")...)
		if len(tokens) == 2 { // the stream that is about to expire: rotate
			writeToken("the-rotated-token")
		}
		mu.Unlock()
		return h(srv, ss)
	})
	c := serveScriptedDial(t, d, []grpc.DialOption{WithTokenFile(tokenFile)}, record)
	lw := NewListerWatcher(c, WatchOptions{Resource: configMaps})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if _, err := lw.ListWithContext(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: "5"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if got, want := events(t, w, 2), []string{"MODIFIED a@6", "MODIFIED a@7"}; !slices.Equal(got, want) {
		t.Fatalf("watch = %v, want %v (resumed, no 401)", got, want)
	}
	if got := d.request(2).GetResumeResourceVersion(); got != "6" {
		t.Errorf("the watch resumed from %q, want 6", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"Bearer first-token", "Bearer first-token", "Bearer the-rotated-token"}; !slices.Equal(tokens, want) {
		t.Errorf("tokens sent = %q, want %q", tokens, want)
	}
}

// TestListerWatcherWithoutARotatedTokenReports401: a token that is still
// refused when the watch resumes is the reflector's to handle (401), not
// retried forever.
func TestListerWatcherWithoutARotatedTokenReports401(t *testing.T) {
	expired := status.Error(codes.Unauthenticated, "informerd: the token expired at 12:00:00")
	d := (&scriptedDaemon{}).
		then(expired, ev(modified, "a", "6")).
		then(expired)
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps})
	w, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "5"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if got, want := events(t, w, 2), []string{"MODIFIED a@6", "ERROR 401"}; !slices.Equal(got, want) {
		t.Errorf("watch = %v, want %v", got, want)
	}
}

// TestListerWatcherKeepsWhatTheReceiverHoldsAcrossWatches: a reflector
// watches again at each timeoutSeconds; the watch it opens from where the
// last one ended answers a RESET with the changes too, not 410.
func TestListerWatcherKeepsWhatTheReceiverHoldsAcrossWatches(t *testing.T) {
	d := (&scriptedDaemon{}).
		then(nil, cm("a", "3"), cm("b", "4"), ev(synced, "", "5")).
		then(nil, ev(modified, "a", "6")).
		then(nil, ev(reset, "", ""), cm("a", "6"), cm("c", "9"), ev(synced, "", "10"))
	lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps})
	if _, err := lw.ListWithContext(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	w1, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "5", AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := events(t, w1, 1), []string{"MODIFIED a@6"}; !slices.Equal(got, want) {
		t.Fatalf("first watch = %v, want %v", got, want)
	}
	w1.Stop()
	w2, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "6", AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop()
	if got, want := events(t, w2, 3), []string{"DELETED b@6", "ADDED c@9", "BOOKMARK @10"}; !slices.Equal(got, want) {
		t.Errorf("second watch = %v, want %v", got, want)
	}
}

// TestResetDifferenceResumedAtEveryPoint (issue 28): a reflector whose
// watch ends at any point of the changes the adapter made of a RESET, and
// that watches again from the last object's resourceVersion (its rule),
// gets the rest of them: it ends with the snapshot, without a 410.
func TestResetDifferenceResumedAtEveryPoint(t *testing.T) {
	withUID := func(e *informerdv1.Event, uid string) *informerdv1.Event {
		e.Object = []byte(strings.Replace(string(e.Object), `"namespace"`, `"uid":"`+uid+`","namespace"`, 1))
		return e
	}
	list := []*informerdv1.Event{cm("a", "1"), cm("b", "2"), cm("c", "3"), withUID(cm("e", "4"), "e1"), cm("f", "5"), ev(synced, "", "6")}
	snapshot := func() []*informerdv1.Event {
		return []*informerdv1.Event{ev(reset, "", ""), cm("a", "1"), cm("b", "9"), cm("d", "8"),
			withUID(cm("e", "10"), "e2"), ev(synced, "", "12")}
	}
	// DELETED c, e, f; ADDED d@8; MODIFIED b@9; ADDED e@10.
	const changes = 6
	want := map[string]string{"a": "1", "b": "9", "d": "8", "e": "10"}
	for k := 1; k <= changes; k++ {
		t.Run(fmt.Sprintf("ended after change %d", k), func(t *testing.T) {
			d := (&scriptedDaemon{}).then(nil, list...).then(nil, snapshot()...).then(nil, snapshot()...)
			lw := NewListerWatcher(serveScripted(t, d), WatchOptions{Resource: configMaps})
			l, err := lw.ListWithContext(t.Context(), metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			held := map[string]string{}
			for _, o := range l.(*unstructured.UnstructuredList).Items {
				held[o.GetName()] = o.GetResourceVersion()
			}
			rv := "6"
			apply := func(w watch.Interface, n int) {
				for range n {
					e, ok := <-w.ResultChan()
					if !ok {
						t.Fatalf("the watch ended; the reflector holds %v", held)
					}
					m, ok := e.Object.(*unstructured.Unstructured)
					if !ok {
						t.Fatalf("%s event: %v", e.Type, e.Object)
					}
					switch e.Type {
					case watch.Added, watch.Modified:
						held[m.GetName()] = m.GetResourceVersion()
					case watch.Deleted:
						delete(held, m.GetName())
					case watch.Bookmark:
					default:
						t.Fatalf("%s event: %v", e.Type, e.Object)
					}
					rv = m.GetResourceVersion()
				}
			}
			w1, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				t.Fatal(err)
			}
			apply(w1, k)
			w1.Stop() // as the reflector does, reading no more
			w2, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				t.Fatal(err)
			}
			defer w2.Stop()
			// The rest of the changes, then the bookmark at 12.
			for rv != "12" {
				apply(w2, 1)
			}
			if !maps.Equal(held, want) {
				t.Errorf("the reflector holds %v, want %v", held, want)
			}
		})
	}
}

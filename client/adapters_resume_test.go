package client

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	for range w1.ResultChan() { // until it has ended
	}
	w2, err := lw.WatchWithContext(t.Context(), metav1.ListOptions{ResourceVersion: "6", AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop()
	if got, want := events(t, w2, 3), []string{"DELETED b@6", "ADDED c@9", "BOOKMARK @10"}; !slices.Equal(got, want) {
		t.Errorf("second watch = %v, want %v", got, want)
	}
}

package main

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/wrapconfig"
)

// TestProxyFilters: the proxy refuses Host headers other than loopback
// names and exec and attach paths, as kubectl proxy; what it forwards
// carries the kubeconfig's credentials, never the caller's.
func TestProxyFilters(t *testing.T) {
	var mu sync.Mutex
	var got []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization")+" "+r.Header.Get("Impersonate-User"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer api.Close()
	c, err := client.Dial(filepath.Join(t.TempDir(), "none.sock"), client.WithToken("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	accept, _ := regexps(defaultAcceptHosts)
	reject, _ := regexps(defaultRejectPaths)
	h, err := newProxy(&rest.Config{Host: api.URL, BearerToken: "kubeconfig-token", Transport: tr}, c, wrapconfig.Options{}, accept, reject)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		method, host, path string
		want               int
	}{
		{http.MethodPost, "127.0.0.1:8001", "/api/v1/namespaces/a/configmaps", http.StatusCreated},
		{http.MethodPost, "localhost:8001", "/api/v1/namespaces/a/configmaps", http.StatusCreated},
		{http.MethodPost, "[::1]:8001", "/api/v1/namespaces/a/configmaps", http.StatusCreated},
		{http.MethodPost, "evil.example:8001", "/api/v1/namespaces/a/configmaps", http.StatusForbidden},
		{http.MethodPost, "127.0.0.1:8001", "/api/v1/namespaces/a/pods/p/exec", http.StatusForbidden},
		{http.MethodGet, "127.0.0.1:8001", "/api/v1/namespaces/a/pods/p/attach", http.StatusForbidden},
		// -reject-paths hold for the paths the API server would clean.
		{http.MethodPost, "127.0.0.1:8001", "//api/v1/namespaces/a/pods/p/exec", http.StatusForbidden},
		{http.MethodPost, "127.0.0.1:8001", "/api/v1/namespaces/a/pods/p/./exec", http.StatusForbidden},
		{http.MethodPost, "127.0.0.1:8001", "/api/v1/namespaces/a/pods/q/../p/exec", http.StatusForbidden},
		{http.MethodPost, "127.0.0.1:8001", "/api/v1/namespaces/a/pods/p/%65xec", http.StatusForbidden},
	} {
		req := httptest.NewRequest(tc.method, "http://"+tc.host+tc.path, strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer caller")
		req.Header.Set("Impersonate-User", "admin")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.want {
			t.Errorf("%s %s (Host %s): %d, want %d", tc.method, tc.path, tc.host, rec.Code, tc.want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("the API server got %q, want the 3 accepted requests", got)
	}
	for _, g := range got {
		if g != "POST /api/v1/namespaces/a/configmaps Bearer kubeconfig-token admin" {
			t.Errorf("the API server got %q: want the kubeconfig's token and the caller's impersonation", g)
		}
	}
}

package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/address"
)

func TestParseFlagsNamesTheBadFlag(t *testing.T) {
	tests := []struct {
		args []string
		want string // in the error; "" for success
	}{
		{[]string{"-kubeconfig", "k"}, ""},
		{[]string{"-listen-tcp", "127.0.0.1:7650", "-socket", ""}, ""},
		{[]string{"-listen-tcp", "0.0.0.0:7650"}, "-tls-cert-file"},
		{[]string{"-listen-tcp", "0.0.0.0:7650", "-tls-cert-file", "c", "-tls-key-file", "k"}, ""},
		{[]string{"-metrics-address", "0.0.0.0:7651"}, "-metrics-address"},
		{[]string{"-tls-cert-file", "c"}, "-tls-key-file"},
		{[]string{"-insecure-local-only"}, ""},
		{[]string{"-insecure-local-only", "-listen-tcp", "127.0.0.1:7650"}, "-insecure-local-only"},
		{[]string{"-insecure-local-only", "-metrics-address", "0.0.0.0:7651", "-tls-cert-file", "c", "-tls-key-file", "k"}, "-insecure-local-only"},
		{[]string{"-allowed-uids", "0,1000"}, ""},
		{[]string{"-allowed-uids", "root"}, "-allowed-uids"},
		{[]string{"-serve-sensitive", "secrets,certificatesigningrequests.certificates.k8s.io"}, ""},
		{[]string{"-sensitive-resources", "Bad_Name"}, "-sensitive-resources"},
		{[]string{"-authz-deny-ttl", "0s"}, "-authz-deny-ttl"},
		{[]string{"-max-selector-bytes", "0"}, "-max-selector-bytes"},
		{[]string{"-max-unauthenticated-connections", "100"}, ""},
		{[]string{"-max-unauthenticated-connections", "-1"}, "-max-unauthenticated-connections"},
		{[]string{"-max-connections", "64", "-max-unauthenticated-connections", "65"}, "-max-unauthenticated-connections"},
		{[]string{"-health-address", "nonsense"}, "-health-address"},
		{[]string{"-listen-tcp", "nonsense"}, "-listen-tcp"},
		{[]string{"-socket", ""}, "-socket"},
		{[]string{"-scope", "galaxy"}, "-scope"},
		{[]string{"-linger-ttl", "0s"}, "-linger-ttl"},
		{[]string{"-scope-cluster-at", "0"}, "-scope-cluster-at"},
		{[]string{"-log-max-events", "0"}, "-log-max-events"},
		{[]string{"-upstream-timeout", "0s"}, "-upstream-timeout"},
		{[]string{"-recovery-window", "-1s"}, "-recovery-window"},
		{[]string{"-log-max-bytes", "-1"}, "-log-max-bytes"},
		{[]string{"-log-min-age", "-1s"}, "-log-min-age"},
		{[]string{"-log-level", "loud"}, "-log-level"},
		{[]string{"-log-format", "json"}, ""},
		{[]string{"-log-format", "logfmt"}, "-log-format"},
		{[]string{"-linger-ttl", "soon"}, "linger-ttl"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-max-object-bytes", "0"}, "-max-object-bytes"},
		{[]string{"-max-object-bytes", "999999999"}, "-max-object-bytes"},
		{[]string{"-max-informers", "0"}, "-max-informers"},
		{[]string{"-max-informers-per-caller", "-1"}, "-max-informers-per-caller"},
		{[]string{"-max-log-bytes-total", "-1"}, "-max-log-bytes-total"},
		{[]string{"-max-log-bytes-total", "0"}, ""},
		{[]string{"-unary-calls-per-second", "0"}, "-unary-calls-per-second"},
		{[]string{"-unary-call-burst", "0"}, "-unary-call-burst"},
		{[]string{"-unary-calls-in-flight-per-caller", "-1"}, "-unary-calls-in-flight-per-caller"},
		{[]string{"-unary-call-max-wait", "0s"}, "-unary-call-max-wait"},
		{[]string{"-new-informers-per-minute", "0"}, "-new-informers-per-minute"},
		{[]string{"-new-informer-burst", "0"}, "-new-informer-burst"},
		{[]string{"-stream-write-timeout", "0s"}, "-stream-write-timeout"},
		{[]string{"-address-related", "servers.v1beta3.policy.linkerd.io,selector=spec.podSelector,port=spec.port,field=spec.proxyProtocol",
			"-address-related", "networkpolicies.v1.networking.k8s.io,selector=spec.podSelector"}, ""},
		{[]string{"-address-related", "servers,selector=spec.podSelector"}, "address-related"},
		{[]string{"-address-related", "servers.v1.policy"}, "selector=PATH is required"},
		{[]string{"-address-related", "servers.v1.policy,selector=spec.podSelector,colour=blue"}, "unknown key"},
		{[]string{"-address-related", "servers.v1.policy,selector"}, "address-related"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := parseFlags(tt.args)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error = %v, want one naming %q", err, tt.want)
			}
		})
	}
}

// TestReadyzFollowsTheProber: /readyz answers from the background probe,
// and a request to /readyz never reaches the API server.
func TestReadyzFollowsTheProber(t *testing.T) {
	var requests atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		if r.URL.Path != "/version" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer api.Close()
	kube := kubernetes.NewForConfigOrDie(&rest.Config{Host: api.URL})
	var recovered int
	r := &readiness{onRecover: func() { recovered++ }}
	get := func() int {
		rec := httptest.NewRecorder()
		healthHandler(r).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code
	}
	if got := get(); got != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before the first probe = %d, want 503", got)
	}
	r.probe(context.Background(), kube)
	for range 10 {
		if got := get(); got != http.StatusOK {
			t.Fatalf("/readyz with the API server up = %d, want 200", got)
		}
	}
	if n := requests.Load(); n != 1 {
		t.Fatalf("the API server saw %d requests for one probe and ten /readyz, want 1", n)
	}
	api.Close()
	r.probe(context.Background(), kube)
	if got := get(); got != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with the API server down = %d, want 503", got)
	}
	if recovered != 0 {
		t.Fatalf("the prober reported the API server back %d times before it was, want 0", recovered)
	}
	r.set(nil)
	r.set(nil)
	if recovered != 1 {
		t.Fatalf("the prober reported the API server back %d times for one recovery, want 1", recovered)
	}
}

func TestAddressRelatedFlag(t *testing.T) {
	c, err := parseFlags([]string{"-address-related", "servers.v1beta3.policy.linkerd.io,selector=spec.podSelector,port=spec.port,field=spec.proxyProtocol,field=spec.accessPolicy"})
	if err != nil {
		t.Fatal(err)
	}
	want := address.RelatedKind{
		Resource:     schema.GroupVersionResource{Group: "policy.linkerd.io", Version: "v1beta3", Resource: "servers"},
		SelectorPath: "spec.podSelector", PortPath: "spec.port", Fields: []string{"spec.proxyProtocol", "spec.accessPolicy"},
	}
	if len(c.addressRelated) != 1 || !reflect.DeepEqual(c.addressRelated[0], want) {
		t.Fatalf("parsed %+v, want %+v", c.addressRelated, want)
	}
	if got := c.addressRelated.String(); got != "servers.v1beta3.policy.linkerd.io,selector=spec.podSelector,port=spec.port,field=spec.proxyProtocol,field=spec.accessPolicy" {
		t.Fatalf("String() = %s", got)
	}
}

// TestReadinessSkipsTheProbeWhileInformersHear: a daemon whose informers
// hear from the API server does not probe it; one whose informers have
// gone quiet, or whose last probe failed, does.
func TestReadinessSkipsTheProbeWhileInformersHear(t *testing.T) {
	var requests atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer api.Close()
	kube := kubernetes.NewForConfigOrDie(&rest.Config{Host: api.URL})
	heard := time.Time{}
	r := &readiness{heard: func() time.Time { return heard }}
	ctx := context.Background()
	step := func(what string, want int32) {
		t.Helper()
		before := requests.Load()
		r.tick(ctx, kube, time.Hour)
		if got := requests.Load() - before; got != want {
			t.Fatalf("%s: %d probes, want %d", what, got, want)
		}
	}
	step("never probed, informers heard", 1)
	heard = time.Now()
	step("reachable at the last probe, informers heard since", 0)
	step("again", 0)
	heard = time.Now().Add(-2 * time.Hour)
	step("informers quiet for longer than the interval", 1)
	r.set(errors.New("unreachable"))
	heard = time.Now()
	step("the last probe failed, informers heard since", 1)
}

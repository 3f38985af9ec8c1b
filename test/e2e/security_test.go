package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

// eventStream reads a client Stream in the background.
type eventStream struct {
	events chan *informerdv1.Event
	err    chan error // the error that ended the stream
}

// openStream opens a stream and reads it until the test ends.
func openStream(ctx context.Context, t *testing.T, c *client.Client, opts client.WatchOptions, resume string) *eventStream {
	t.Helper()
	s, err := c.Stream(ctx, opts, resume)
	if err != nil {
		t.Fatal(err)
	}
	es := &eventStream{events: make(chan *informerdv1.Event, 1024), err: make(chan error, 1)}
	done := make(chan struct{})
	go func() { // ends when the stream does
		defer close(done)
		for {
			evs, err := s.Recv()
			if err != nil {
				es.err <- err
				return
			}
			for _, ev := range evs {
				es.events <- ev
			}
		}
	}()
	t.Cleanup(func() { s.Close(); <-done })
	return es
}

// until returns the events up to and including the first that stop
// accepts, failing the test if the stream ends first.
func (es *eventStream) until(ctx context.Context, t *testing.T, what string, stop func(*informerdv1.Event) bool) []*informerdv1.Event {
	t.Helper()
	var got []*informerdv1.Event
	for {
		select {
		case ev := <-es.events:
			got = append(got, ev)
			if stop(ev) {
				return got
			}
		case err := <-es.err:
			// The events queued before the error may hold the one awaited.
			for _, ev := range es.queued() {
				got = append(got, ev)
				if stop(ev) {
					es.err <- err // for the next reader
					return got
				}
			}
			t.Fatalf("%s: the stream ended first with %v after %s", what, err, describe(got))
		case <-ctx.Done():
			t.Fatalf("%s: never happened; got %s", what, describe(got))
		}
	}
}

// rest returns the events up to the stream's end and the error it ended
// with.
func (es *eventStream) rest(ctx context.Context, t *testing.T) ([]*informerdv1.Event, error) {
	t.Helper()
	var got []*informerdv1.Event
	for {
		select {
		case ev := <-es.events:
			got = append(got, ev)
		case err := <-es.err:
			return append(got, es.queued()...), err
		case <-ctx.Done():
			t.Fatalf("the stream did not end; got %s", describe(got))
		}
	}
}

// queued returns the events the stream's goroutine has queued. Once its
// error is taken that is every event the stream received: the goroutine
// queues them before the error, and a select between the two channels
// may take the error first.
func (es *eventStream) queued() []*informerdv1.Event {
	var got []*informerdv1.Event
	for {
		select {
		case ev := <-es.events:
			got = append(got, ev)
		default:
			return got
		}
	}
}

// end waits for the stream's error.
func (es *eventStream) end(ctx context.Context, t *testing.T) error {
	t.Helper()
	for {
		select {
		case <-es.events:
		case err := <-es.err:
			return err
		case <-ctx.Done():
			t.Fatal("the stream did not end")
		}
	}
}

func isType(typ informerdv1.EventType) func(*informerdv1.Event) bool {
	return func(ev *informerdv1.Event) bool { return ev.GetType() == typ }
}

// isAdded reports an ADDED event of the object named name.
func isAdded(name string) func(*informerdv1.Event) bool {
	return func(ev *informerdv1.Event) bool {
		if ev.GetType() != informerdv1.EventType_EVENT_TYPE_ADDED {
			return false
		}
		o, _ := decodeUnstructured(ev.GetObject())
		return o.GetName() == name
	}
}

// describe lists events as "TYPE namespace/name".
func describe(evs []*informerdv1.Event) string {
	var out []string
	for _, ev := range evs {
		s := strings.TrimPrefix(ev.GetType().String(), "EVENT_TYPE_")
		if o, err := decodeUnstructured(ev.GetObject()); err == nil && o.GetName() != "" {
			s += " " + o.GetNamespace() + "/" + o.GetName()
		}
		out = append(out, s)
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// checkIsolated fails the test unless every object event is of namespace
// ns and every marker carries nothing but its resourceVersion.
func checkIsolated(t *testing.T, what, ns string, evs []*informerdv1.Event) {
	t.Helper()
	for _, ev := range evs {
		switch ev.GetType() {
		case informerdv1.EventType_EVENT_TYPE_BOOKMARK, informerdv1.EventType_EVENT_TYPE_SYNCED:
			var m struct {
				Metadata map[string]any `json:"metadata"`
				Rest     map[string]any `json:"-"`
			}
			if err := json.Unmarshal(ev.GetObject(), &m); err != nil {
				t.Fatalf("%s: a %s is not JSON: %v", what, ev.GetType(), err)
			}
			if len(m.Metadata) != 1 || m.Metadata["resourceVersion"] == nil {
				t.Fatalf("%s: a %s carries %s; want only a resourceVersion", what, ev.GetType(), ev.GetObject())
			}
		case informerdv1.EventType_EVENT_TYPE_RESET:
			if len(ev.GetObject()) != 0 {
				t.Fatalf("%s: a RESET carries %s", what, ev.GetObject())
			}
		default:
			o, err := decodeUnstructured(ev.GetObject())
			if err != nil || o.GetNamespace() != ns {
				t.Fatalf("%s: %s of namespace %q reached a caller of %s only (%v); all: %s", what, ev.GetType(), o.GetNamespace(), ns, err, describe(evs))
			}
		}
	}
}

// TestIsolationInSharedInformer: a caller allowed to read one namespace is
// served from a cluster-wide informer that another caller holds, and gets
// every change of its namespace and nothing of another: no object, no
// deletion, no label-selector transition, no marker content, whether live,
// from a compacted catch-up or from a RESET's snapshot. Its cluster-wide
// and other-namespace requests are refused.
func TestIsolationInSharedInformer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A resource of this test only: no other test's churn moves its log.
	dyn := dynamic.NewForConfigOrDie(env.RESTConfig())
	gvr := schema.GroupVersionResource{Group: "iso.informerd.dev", Version: "v1", Resource: "isolations"}
	createCRD(ctx, t, dyn, gvr, "Isolation")
	nsA, nsB := createNamespace(ctx, t, "iso-a"), createNamespace(ctx, t, "iso-b")
	res := func(ns string) dynamic.ResourceInterface { return dyn.Resource(gvr).Namespace(ns) }
	put := func(ns, name string, labels map[string]string, data string) {
		t.Helper()
		o := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "iso.informerd.dev/v1", "kind": "Isolation",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"data": data},
		}}
		o.SetLabels(labels)
		cur, err := res(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			o.SetResourceVersion(cur.GetResourceVersion())
			_, err = res(ns).Update(ctx, o, metav1.UpdateOptions{})
		} else {
			_, err = res(ns).Create(ctx, o, metav1.CreateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	del := func(ns, name string) {
		t.Helper()
		if err := res(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	x, y := map[string]string{"team": "x"}, map[string]string{"team": "y"}
	for _, ns := range []string{nsA, nsB} {
		put(ns, "pre", x, "0")
	}

	// A one-event log remembering two deletions: resuming needs the
	// compacted catch-up or, past the deletions it remembers, a RESET.
	d := startDaemon(t, cache.Options{Scope: cache.ScopeCluster, Log: cache.LogLimits{MaxEvents: 1, MinAge: -1, MaxTombstones: 2}})
	holder := openStream(ctx, t, d.dial(t, reads(gvr, "")), client.WatchOptions{Resource: gvr, ClientName: "cluster-wide"}, "")
	holder.until(ctx, t, "the cluster-wide holder syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))

	a := d.dial(t, reads(gvr, nsA))
	for _, ns := range []string{"", nsB} {
		err := openStream(ctx, t, a, client.WatchOptions{Resource: gvr, Namespace: ns}, "").end(ctx, t)
		where := "cluster-wide"
		if ns != "" {
			where = "in namespace " + ns
		}
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "may not list isolations.iso.informerd.dev "+where) {
			t.Fatalf("a caller of %s asking for %q: %v; want PERMISSION_DENIED naming the verb, resource and scope", nsA, ns, err)
		}
	}
	plain := openStream(ctx, t, a, client.WatchOptions{Resource: gvr, Namespace: nsA, ClientName: "a"}, "")
	evs := plain.until(ctx, t, "a's snapshot", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	checkIsolated(t, "a's snapshot", nsA, evs)
	r0 := evs[len(evs)-1].GetResourceVersion()
	selected := openStream(ctx, t, a, client.WatchOptions{Resource: gvr, Namespace: nsA, LabelSelector: "team=x", ClientName: "a-selected"}, "")
	checkIsolated(t, "a's selected snapshot", nsA, selected.until(ctx, t, "a's selected snapshot", isType(informerdv1.EventType_EVENT_TYPE_SYNCED)))

	infs, err := d.dial(t, introspects).API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(infs.GetInformers()); n != 1 || infs.GetInformers()[0].GetNamespace() != "" || infs.GetInformers()[0].GetRefCount() != 3 {
		t.Fatalf("informers: %v; want one cluster-wide informer serving the holder and a's two streams", infs.GetInformers())
	}

	// Every event type in both namespaces: create, update, leave and enter
	// the selector, delete.
	life := func(ns string) {
		put(ns, "o", x, "1")
		put(ns, "o", x, "2")
		put(ns, "o", y, "2")
		put(ns, "o", x, "2")
		del(ns, "o")
	}
	life(nsB)
	life(nsA)
	life(nsB)
	put(nsA, "end", x, "0")
	want := []string{"ADDED " + nsA + "/o", "MODIFIED " + nsA + "/o", "MODIFIED " + nsA + "/o", "MODIFIED " + nsA + "/o", "DELETED " + nsA + "/o", "ADDED " + nsA + "/end"}
	got := plain.until(ctx, t, "a sees its end marker", isAdded("end"))
	checkIsolated(t, "a's stream", nsA, got)
	if describe(got) != "["+strings.Join(want, ", ")+"]" {
		t.Fatalf("a's stream: %s, want %v", describe(got), want)
	}
	// Through the selector: the label change is a DELETED, then an ADDED.
	want = []string{"ADDED " + nsA + "/o", "MODIFIED " + nsA + "/o", "DELETED " + nsA + "/o", "ADDED " + nsA + "/o", "DELETED " + nsA + "/o", "ADDED " + nsA + "/end"}
	got = selected.until(ctx, t, "a's selected stream sees its end marker", isAdded("end"))
	checkIsolated(t, "a's selected stream", nsA, got)
	if describe(got) != "["+strings.Join(want, ", ")+"]" {
		t.Fatalf("a's selected stream: %s, want %v", describe(got), want)
	}
	r1 := got[len(got)-1].GetResourceVersion()

	// Resuming from before three deletions: past what the log remembers,
	// a RESET and a fresh snapshot of namespace a only.
	got = openStream(ctx, t, a, client.WatchOptions{Resource: gvr, Namespace: nsA, ClientName: "a-reset"}, r0).
		until(ctx, t, "a's RESET snapshot", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	checkIsolated(t, "a's RESET", nsA, got)
	if got[0].GetType() != informerdv1.EventType_EVENT_TYPE_RESET || len(got) != 4 {
		t.Fatalf("resuming from before the deletions: %s; want RESET, a's two objects, SYNCED", describe(got))
	}

	// Resuming from after them: a compacted catch-up of the changes since,
	// namespace a's only, ended by a BOOKMARK.
	put(nsB, "end", x, "0")
	del(nsB, "pre")
	del(nsA, "pre")
	put(nsA, "end", x, "1")
	put(nsB, "late", x, "0")
	put(nsA, "late", x, "0")
	plain.until(ctx, t, "a sees its late marker", isAdded("late"))
	got = openStream(ctx, t, a, client.WatchOptions{Resource: gvr, Namespace: nsA, ClientName: "a-catch-up"}, r1).
		until(ctx, t, "a's catch-up", isType(informerdv1.EventType_EVENT_TYPE_BOOKMARK))
	checkIsolated(t, "a's catch-up", nsA, got)
	want = []string{"DELETED " + nsA + "/pre", "MODIFIED " + nsA + "/end", "ADDED " + nsA + "/late", "BOOKMARK"}
	if describe(got) != "["+strings.Join(want, ", ")+"]" {
		t.Fatalf("a's catch-up: %s, want %v", describe(got), want)
	}
}

// TestAuthenticationFailures: each way a token can be wrong gets
// UNAUTHENTICATED with its own message, decided by the API server's
// TokenReview; a token bound to a pod on another node is refused by the
// node's daemon and accepted by the pod's.
func TestAuthenticationFailures(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	ns := createNamespace(ctx, t, "authn")
	// The pod's node serves it; a daemon of another node refuses it.
	here := startDaemon(t, cache.Options{})
	elsewhere := startDaemon(t, cache.Options{}, func(s *security) { s.Authn.NodeName = "node-elsewhere" })

	saNs, podSA := newServiceAccount(t)
	grant(t, saNs, podSA, reads(configMaps, ns))
	mintToken(t, saNs, podSA, auth.DefaultAudience) // creates the ServiceAccount
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bound"},
		Spec: corev1.PodSpec{
			ServiceAccountName: podSA, NodeName: controlplane.FakeNodeName, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}},
		},
	}
	if _, err := admin.CoreV1().Pods(saNs).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	podToken, err := controlplane.PodToken(ctx, admin, saNs, podSA, "bound", auth.DefaultAudience)
	if err != nil {
		t.Fatal(err)
	}
	opts := client.WatchOptions{Resource: configMaps, Namespace: ns}
	openStream(ctx, t, dialWith(t, here.socket, client.WithToken(podToken)), opts, "").
		until(ctx, t, "the pod-bound token on its own node's daemon", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))

	deletedNs, deletedSA := newServiceAccount(t)
	deletedToken := mintToken(t, deletedNs, deletedSA, auth.DefaultAudience)
	if err := admin.CoreV1().ServiceAccounts(deletedNs).Delete(ctx, deletedSA, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wrongNs, wrongSA := newServiceAccount(t)

	noToken, err := grpc.NewClient("unix://"+here.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = noToken.Close() }()
	tests := []struct {
		name  string
		d     *testDaemon
		token string // "" sends none
		want  string
	}{
		{"no token", here, "", `no token: send a projected ServiceAccount token with audience "informerd"`},
		{"garbage", here, "garbage", "malformed token: not a JWT"},
		{"wrong audience", here, mintToken(t, wrongNs, wrongSA, "vault"), `wrong audience: the token is for ["vault"], not "informerd"`},
		{"deleted ServiceAccount", here, deletedToken, "the token's ServiceAccount " + deletedNs + "/" + deletedSA + " has been deleted"},
		{"bound to a pod on another node", elsewhere, podToken,
			"the token is bound to pod " + saNs + "/bound on node " + controlplane.FakeNodeName + ", and this informerd serves node node-elsewhere"},
	}
	if env.Owned() {
		expNs, expSA := newServiceAccount(t)
		expired, err := env.ExpiredToken(identityToken(t, expNs, expSA, reads(configMaps, ns)), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		tests = append(tests, struct {
			name  string
			d     *testDaemon
			token string
			want  string
		}{"expired", here, expired, "the token expired at"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var (
				s   grpc.ServerStreamingClient[informerdv1.WatchResponse]
				err error
			)
			req := &informerdv1.WatchRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: ns}
			if tt.token == "" {
				s, err = informerdv1.NewInformerServiceClient(noToken).Watch(ctx, req)
			} else {
				s, err = dialWith(t, tt.d.socket, client.WithToken(tt.token)).API().Watch(ctx, req)
			}
			if err == nil {
				_, err = s.Recv()
			}
			if status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Fatalf("got %v; want UNAUTHENTICATED saying %q", err, tt.want)
			}
			t.Logf("%s: %s", tt.name, status.Convert(err).Message())
		})
	}
}

// identityToken is identity for a ServiceAccount name picked by the caller.
func identityToken(t *testing.T, ns, name string, perms ...permission) string {
	t.Helper()
	grant(t, ns, name, perms...)
	return mintToken(t, ns, name, auth.DefaultAudience)
}

// TestRevokedPermissionEndsStream: when RBAC stops allowing a stream's
// caller to read, the stream ends with PERMISSION_DENIED naming the verb,
// resource and namespace, within the allow-cache TTL.
func TestRevokedPermissionEndsStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ttl = 3 * time.Second
	ns := createNamespace(ctx, t, "revoke")
	d := startDaemon(t, cache.Options{}, func(s *security) { s.Authz.AllowTTL = ttl })
	saNs, sa := newServiceAccount(t)
	c := dialWith(t, d.socket, client.WithToken(identityToken(t, saNs, sa, reads(configMaps, ns))))
	s := openStream(ctx, t, c, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "revoked"}, "")
	s.until(ctx, t, "the stream syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))

	user, revoked := revokeConfigMaps(ctx, t, saNs, sa, ns)
	err := s.end(ctx, t)
	took := time.Since(revoked)
	t.Logf("the stream ended %s after the revocation took effect (allow TTL %s): %v", took.Round(time.Millisecond), ttl, err)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), user+" may not list configmaps in namespace "+ns) {
		t.Fatalf("after the revocation the stream ended with %v; want PERMISSION_DENIED naming the verb, resource and namespace", err)
	}
	if took > ttl+time.Second {
		t.Fatalf("the stream outlived its revocation by %s, more than the allow TTL %s (+1s)", took, ttl)
	}
}

// revokeConfigMaps revokes what the ServiceAccount saNs/sa was granted in
// ns, waits until the API server's authorizer no longer lets it list
// configmaps there, and returns its user name and when that was.
func revokeConfigMaps(ctx context.Context, t *testing.T, saNs, sa, ns string) (user string, revoked time.Time) {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	if err := controlplane.Revoke(ctx, admin, saNs, sa, ns); err != nil {
		t.Fatal(err)
	}
	user = "system:serviceaccount:" + saNs + ":" + sa
	eventually(ctx, t, "RBAC no longer allows "+user, func() bool {
		r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNs, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "configmaps", Namespace: ns},
		}}, metav1.CreateOptions{})
		return err == nil && !r.Status.Allowed
	})
	return user, time.Now()
}

// TestSecretsRefusedUnlessOptedIn: Secrets are refused even to a
// cluster-admin caller, saying how to opt in; once the operator opts in,
// they are served under the caller's RBAC.
func TestSecretsRefusedUnlessOptedIn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "secrets")
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s1"}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	saNs, root := newServiceAccount(t)
	rootToken := mintToken(t, saNs, root, auth.DefaultAudience)
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "informerd-test-" + saNs + "-" + root + "-cluster-admin"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: saNs, Name: root}},
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
	grant(t, saNs, root, reads(secrets, "")) // waits until cluster-admin is in effect too
	limited := identity(t, reads(configMaps, ns))
	opts := client.WatchOptions{Resource: secrets, Namespace: ns}

	def := startDaemon(t, cache.Options{})
	err := openStream(ctx, t, dialWith(t, def.socket, client.WithToken(rootToken)), opts, "").end(ctx, t)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "-serve-sensitive=secrets") {
		t.Fatalf("secrets for a cluster-admin, by default: %v; want PERMISSION_DENIED saying how to opt in", err)
	}

	optedIn := startDaemon(t, cache.Options{}, func(s *security) { s.ServeSensitive = []schema.GroupResource{secrets.GroupResource()} })
	got := openStream(ctx, t, dialWith(t, optedIn.socket, client.WithToken(rootToken)), opts, "").
		until(ctx, t, "secrets for a cluster-admin, opted in", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	if !strings.Contains(describe(got), "ADDED "+ns+"/s1") {
		t.Fatalf("opted in, a cluster-admin got %s; want the secret", describe(got))
	}
	err = openStream(ctx, t, dialWith(t, optedIn.socket, client.WithToken(limited)), opts, "").end(ctx, t)
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "may not list secrets in namespace "+ns) {
		t.Fatalf("opted in, a caller without RBAC for secrets: %v; want PERMISSION_DENIED from its RBAC", err)
	}
}

// reviewCounts are the TokenReviews and SubjectAccessReviews the API
// server has served, by its own metrics.
func reviewCounts(ctx context.Context, t *testing.T) (tokenReviews, accessReviews int) {
	m := scrapeAPIServer(ctx, t)
	return int(m.sum("apiserver_request_total", map[string]string{"verb": "POST", "group": "authentication.k8s.io", "resource": "tokenreviews"})),
		int(m.sum("apiserver_request_total", map[string]string{"verb": "POST", "group": "authorization.k8s.io", "resource": "subjectaccessreviews"}))
}

// TestReviewCountsProveTheCaches: 50 subscriptions by one caller within the
// TTLs, 25 of them at once, cost the API server one TokenReview and one
// SubjectAccessReview per verb (list, watch) for the resource and
// namespace, counted by the API server's own apiserver_request_total.
func TestReviewCountsProveTheCaches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "counts")
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(configMaps, ns)) // the harness's own reviews happen here
	tr0, sar0 := reviewCounts(ctx, t)
	opts := client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "counted"}
	var streams []*eventStream
	for range 25 { // at once: they share the reviews in flight
		streams = append(streams, openStream(ctx, t, c, opts, ""))
	}
	for _, s := range streams {
		s.until(ctx, t, "a concurrent subscription syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	}
	for range 25 { // one after another: from the caches
		openStream(ctx, t, c, opts, "").until(ctx, t, "a subscription syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	}
	tr1, sar1 := reviewCounts(ctx, t)
	t.Logf("50 subscriptions: %d TokenReview(s), %d SubjectAccessReview(s)", tr1-tr0, sar1-sar0)
	if tr1-tr0 != 1 || sar1-sar0 != 2 {
		t.Fatalf("50 subscriptions by one caller made %d TokenReviews and %d SubjectAccessReviews; want 1 and 2 (list and watch of configmaps in %s)", tr1-tr0, sar1-sar0, ns)
	}
}

// TestTokenReviewsAreBoundedForStrangers: garbage tokens cost no
// TokenReview; forged JWTs, 100 at once from one source, cost at most the
// shared budget of new tokens (its burst and rate), each source having at
// most MaxPendingPerSource of them pending (the rest get
// RESOURCE_EXHAUSTED at once); another source's callers, streaming or new,
// are not affected.
func TestTokenReviewsAreBoundedForStrangers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "flood")
	const burst = 10
	d := startDaemon(t, cache.Options{}, func(s *security) {
		s.TCP = "127.0.0.1:0"
		s.Authn.ReviewsPerSecond, s.Authn.ReviewBurst = 1, burst
	})
	// The bystander: a Unix socket caller (its source is its uid).
	bystander := newRecorder()
	runWatcher(t, d.dial(t, reads(configMaps, ns)), client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "bystander"}, bystander)
	<-bystander.synced

	// The attacker connects over TCP (its source is loopback).
	attack := func(token string) error {
		c, err := client.Dial(d.tcp, client.WithToken(token))
		if err != nil {
			return err
		}
		defer c.Close()
		s, err := c.Stream(ctx, client.WatchOptions{Resource: configMaps, Namespace: ns}, "")
		if err == nil {
			_, err = s.Recv()
			s.Close()
		}
		return err
	}
	tr0, _ := reviewCounts(ctx, t)
	for i := range 100 {
		if err := attack(fmt.Sprintf("garbage-%d", i)); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("garbage token: %v, want UNAUTHENTICATED", err)
		}
	}
	if tr, _ := reviewCounts(ctx, t); tr != tr0 {
		t.Fatalf("100 garbage tokens cost %d TokenReviews, want none", tr-tr0)
	}
	start := time.Now()
	codesSeen := make(chan codes.Code, 100)
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() { codesSeen <- status.Code(attack(forgedJWT(i))) })
	}
	wg.Wait()
	close(codesSeen)
	var throttled int
	for code := range codesSeen {
		switch code {
		case codes.ResourceExhausted:
			throttled++
		case codes.Unauthenticated: // reviewed, and rejected: its signature is no one's
		default:
			t.Fatalf("forged token: %v", code)
		}
	}
	tr1, _ := reviewCounts(ctx, t)
	allowed := burst + int(time.Since(start).Seconds()) + 1
	t.Logf("100 forged tokens at once: %d TokenReviews (bound %d), %d refused with RESOURCE_EXHAUSTED", tr1-tr0, allowed, throttled)
	if tr1-tr0 > allowed || throttled == 0 {
		t.Fatalf("100 forged tokens from one source cost %d TokenReviews (%d throttled); want at most %d", tr1-tr0, throttled, allowed)
	}

	// The bystander kept streaming, and a new caller of its source gets in.
	createConfigMap(ctx, t, ns, "after-the-flood", nil)
	bystander.waitFor(ctx, t, "the bystander still streams", func(m map[string]string) bool { return m[ns+"/after-the-flood"] != "" })
	openStream(ctx, t, d.dial(t, reads(configMaps, ns)), client.WatchOptions{Resource: configMaps, Namespace: ns}, "").
		until(ctx, t, "a new caller on the Unix socket", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
}

// forgedJWT is shaped like a ServiceAccount token for informerd, signed by
// no one.
func forgedJWT(i int) string {
	part := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return part(map[string]string{"alg": "RS256"}) + "." +
		part(map[string]any{"aud": []string{"informerd"}, "exp": time.Now().Add(time.Hour).Unix(), "sub": fmt.Sprintf("system:serviceaccount:x:forged-%d", i)}) + ".c2lnbmF0dXJl"
}

// TestIntrospectionShowsCallersTheirOwn: a caller sees the informers its
// own streams hold, with only its own streams; a caller allowed get on
// /informerd/informers sees every stream, with its user and the peer
// credentials (SO_PEERCRED) of its process.
func TestIntrospectionShowsCallersTheirOwn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nsA, nsB := createNamespace(ctx, t, "intro-a"), createNamespace(ctx, t, "intro-b")
	d := startDaemon(t, cache.Options{Scope: cache.ScopeNamespace})
	a := d.dial(t, reads(configMaps, nsA))
	openStream(ctx, t, a, client.WatchOptions{Resource: configMaps, Namespace: nsA, ClientName: "mine"}, "").
		until(ctx, t, "a syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	openStream(ctx, t, d.dial(t, reads(configMaps, nsB)), client.WatchOptions{Resource: configMaps, Namespace: nsB, ClientName: "theirs"}, "").
		until(ctx, t, "b syncs", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))

	own, err := a.API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if infs := own.GetInformers(); len(infs) != 1 || infs[0].GetNamespace() != nsA || !slices.Equal(infs[0].GetHolders(), []string{"mine"}) ||
		infs[0].GetObjects() != 0 || len(infs[0].GetSubscribers()) != 1 {
		t.Fatalf("a caller's own view: %v; want its one informer, its one stream, no counts", infs)
	}
	all, err := d.dial(t, introspects).API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.GetInformers()) != 2 {
		t.Fatalf("the introspector's view: %v; want both informers", all.GetInformers())
	}
	peer := fmt.Sprintf("uid=%d gid=%d pid=%d", os.Getuid(), os.Getgid(), os.Getpid())
	for _, in := range all.GetInformers() {
		subs := in.GetSubscribers()
		if len(subs) != 1 || subs[0].GetPeer() != peer || !strings.HasPrefix(subs[0].GetUser(), "system:serviceaccount:") || in.GetObjects() == 0 {
			t.Fatalf("informer %s: subscribers %v, objects %d; want one, from %s, with the counts", in.GetNamespace(), subs, in.GetObjects(), peer)
		}
	}
}

// TestMetricsEndpointRequiresAuthorization: /metrics and /debug/pprof/ are
// served only to callers allowed a non-resource get on their path;
// /healthz and /readyz to anyone.
func TestMetricsEndpointRequiresAuthorization(t *testing.T) {
	d := startDaemonProcess(t, t.TempDir()+"/informerd.sock", "-enable-pprof")
	get := func(path, token string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, d.metrics+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eventually(ctx, t, "/readyz after the first probe", func() bool { return get("/readyz", "") == http.StatusOK })
	nobody := identity(t)
	scraper := identity(t, permission{path: "/metrics"})
	profiler := identity(t, permission{path: "/debug/pprof/cmdline"})
	for _, tt := range []struct {
		path, token string
		want        int
	}{
		{"/healthz", "", http.StatusOK},
		{"/metrics", "", http.StatusUnauthorized},
		{"/metrics", "garbage", http.StatusUnauthorized},
		{"/metrics", nobody, http.StatusForbidden},
		{"/metrics", scraper, http.StatusOK},
		{"/debug/pprof/cmdline", "", http.StatusUnauthorized},
		{"/debug/pprof/cmdline", scraper, http.StatusForbidden},
		{"/debug/pprof/cmdline", profiler, http.StatusOK},
	} {
		if got := get(tt.path, tt.token); got != tt.want {
			t.Errorf("GET %s with token %.10q: %d, want %d", tt.path, tt.token, got, tt.want)
		}
	}
}

// TestTLSListener: over TCP the daemon speaks TLS with the certificate it
// is given; a client that trusts the CA and checks the daemon's name gets
// in with its token, one that talks in the clear or expects another name
// does not.
func TestTLSListener(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "tls")
	caFile, cert := testCertificate(t, "informerd")
	d := startDaemon(t, cache.Options{}, func(s *security) {
		s.TCP = "127.0.0.1:0"
		s.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	})
	token := client.WithToken(identity(t, reads(configMaps, ns)))
	opts := client.WatchOptions{Resource: configMaps, Namespace: ns}
	openStream(ctx, t, dialWith(t, d.tcp, client.WithTLS(caFile, "informerd"), token), opts, "").
		until(ctx, t, "a TLS client", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	for name, c := range map[string]*client.Client{
		"in the clear": dialWith(t, d.tcp, token),
		"another name": dialWith(t, d.tcp, client.WithTLS(caFile, "impostor"), token),
		"another CA":   dialWith(t, d.tcp, client.WithTLS(func() string { f, _ := testCertificate(t, "informerd"); return f }(), "informerd"), token),
	} {
		sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
		s, err := c.Stream(sctx, opts, "")
		if err == nil {
			_, err = s.Recv()
			s.Close()
		}
		scancel()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("a client %s: %v, want UNAVAILABLE (no connection)", name, err)
		}
	}
}

// testCertificate makes a CA and a certificate it signs for name and
// 127.0.0.1; it returns the CA's PEM file and the certificate.
func testCertificate(t *testing.T, name string) (string, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "informerd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return caFile, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

package wrapconfig

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

func podWithUID(name, rv, uid string) *corev1.Pod {
	p := testPod(name, rv)
	p.UID = types.UID(uid)
	return p
}

// TestReadMetaAndStamp: the metadata read from both encodings, and a
// deletion's stamp changes the resourceVersion and nothing else.
func TestReadMetaAndStamp(t *testing.T) {
	p := podWithUID("a", "17", "uid-a")
	p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "m", Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1"}}
	for _, proto := range []bool{false, true} {
		t.Run(fmt.Sprint("protobuf=", proto), func(t *testing.T) {
			b := podBytes(t, p, proto)
			m, err := readMeta(b)
			if err != nil {
				t.Fatal(err)
			}
			if want := (objectMeta{"ns", "a", "17", "uid-a"}); m != want {
				t.Errorf("readMeta = %+v, want %+v", m, want)
			}
			stamped, err := withResourceVersion(b, "99")
			if err != nil {
				t.Fatal(err)
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(stamped, nil, nil)
			if err != nil {
				t.Fatalf("decoding the stamped object: %v", err)
			}
			got := obj.(*corev1.Pod)
			want := p.DeepCopy()
			want.ResourceVersion = "99"
			got.TypeMeta = want.TypeMeta
			if !equalJSON(t, got, want) {
				t.Errorf("stamped: %+v, want %+v", got, want)
			}
		})
	}
	// The API server writes metadata before spec; anything else is read too.
	m, err := readMeta([]byte(`{"spec":{"x":[1,{"metadata":"no"}]},"metadata":{"name":"n","resourceVersion":"3"}}`))
	if err != nil || m.name != "n" || m.resourceVersion != "3" {
		t.Errorf("readMeta after spec = %+v, %v", m, err)
	}
	for _, bad := range []string{``, `[]`, `{"kind":"Pod"}`, "k8s\x00\x0a"} {
		if _, err := readMeta([]byte(bad)); err == nil {
			t.Errorf("readMeta(%q): no error", bad)
		}
	}
}

func equalJSON(t *testing.T, a, b runtime.Object) bool {
	t.Helper()
	return string(mustJSON(t, a)) == string(mustJSON(t, b))
}

func mustJSON(t *testing.T, o runtime.Object) []byte {
	t.Helper()
	b, err := runtime.Encode(scheme.Codecs.LegacyCodec(corev1.SchemeGroupVersion), o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWrapResetAnsweredWithTheChanges: a watch resuming from a list the
// wrapper served answers the daemon's RESET with the changes from what
// the caller holds to the snapshot (deletions first, stamped with the
// caller's position, then the rest in resourceVersion order, then a
// bookmark), not a 410; the next watch, from the last position it was
// told, does the same from what the first one left.
func TestWrapResetAnsweredWithTheChanges(t *testing.T) {
	for _, ct := range contentTypes {
		t.Run(ct.name, func(t *testing.T) {
			f := newWrapFixture(t, Options{})
			proto := ct.name == "protobuf"
			ev := func(typ informerdv1.EventType, p *corev1.Pod) *informerdv1.Event { return podEvent(t, typ, p, proto) }
			added := informerdv1.EventType_EVENT_TYPE_ADDED
			synced, reset := informerdv1.EventType_EVENT_TYPE_SYNCED, &informerdv1.Event{Type: informerdv1.EventType_EVENT_TYPE_RESET}
			f.daemon.set(nil, ev(added, podWithUID("a", "10", "ua")), ev(added, podWithUID("b", "11", "ub")),
				ev(added, podWithUID("c", "12", "uc")), marker(synced, "20"))
			pods := f.clientset(t, ct.contentType).CoreV1().Pods("ns")
			l, err := pods.List(context.Background(), metav1.ListOptions{})
			if err != nil || len(l.Items) != 3 || l.ResourceVersion != "20" {
				t.Fatalf("list: %v, %v", l, err)
			}

			// a modified, b deleted and created again, c deleted, d added.
			f.daemon.set(nil, reset, ev(added, podWithUID("a", "25", "ua")), ev(added, podWithUID("b", "26", "ub2")),
				ev(added, podWithUID("d", "24", "ud")), marker(synced, "30"))
			w, err := pods.Watch(context.Background(), metav1.ListOptions{ResourceVersion: "20", AllowWatchBookmarks: true})
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"DELETED b 20 ub", "DELETED c 20 uc", "ADDED d 24 ud", "MODIFIED a 25 ua", "ADDED b 26 ub2", "BOOKMARK  30 "}
			expectEvents(t, w, want)
			close(f.daemon.end) // the stream ends, as at timeoutSeconds; the watch with it
			if ev, ok := <-w.ResultChan(); ok {
				t.Fatalf("after the stream ended: %s %#v", ev.Type, ev.Object)
			}

			// What the caller holds now: a, b, d; resuming from 30.
			f.daemon.set(nil, reset, ev(added, podWithUID("a", "25", "ua")), marker(synced, "31"))
			w, err = pods.Watch(context.Background(), metav1.ListOptions{ResourceVersion: "30"})
			if err != nil {
				t.Fatal(err)
			}
			expectEvents(t, w, []string{"DELETED b 30 ub2", "DELETED d 30 ud"})
			w.Stop()

			if got := f.api.got(); len(got) != 0 {
				t.Errorf("the API server got %v, want nothing", got)
			}
			if got := testutil.ToFloat64(wrapResets(f.reg).WithLabelValues(resetCaughtUp)); got != 2 {
				t.Errorf("resets caught up: %v, want 2", got)
			}
		})
	}
}

// expectEvents receives len(want) events from w, each "TYPE name rv uid".
func expectEvents(t *testing.T, w watch.Interface, want []string) {
	t.Helper()
	for i, wantEv := range want {
		ev := recv(t, w)
		m, err := metaOf(ev.Object)
		if err != nil {
			t.Fatalf("event %d: %s %#v", i, ev.Type, ev.Object)
		}
		if got := fmt.Sprintf("%s %s %s %s", ev.Type, m.GetName(), m.GetResourceVersion(), m.GetUID()); got != wantEv {
			t.Errorf("event %d: %q, want %q", i, got, wantEv)
		}
	}
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	if p, ok := o.(*corev1.Pod); ok {
		return p, nil
	}
	return nil, fmt.Errorf("not a pod: %T", o)
}

// TestWrapResetWithoutWhatTheCallerHoldsIs410: a watch that knows nothing
// of what its caller holds (its list went elsewhere, or long ago) still
// answers a RESET with 410, and counts it.
func TestWrapResetWithoutWhatTheCallerHoldsIs410(t *testing.T) {
	f := newWrapFixture(t, Options{})
	f.daemon.set(nil, marker(informerdv1.EventType_EVENT_TYPE_BOOKMARK, "21"),
		&informerdv1.Event{Type: informerdv1.EventType_EVENT_TYPE_RESET},
		marker(informerdv1.EventType_EVENT_TYPE_SYNCED, "30"))
	w, err := f.clientset(t, "application/json").CoreV1().Pods("ns").Watch(context.Background(), metav1.ListOptions{ResourceVersion: "20"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if ev := recv(t, w); ev.Type != watch.Error {
		t.Fatalf("after RESET: %s %#v, want ERROR 410", ev.Type, ev.Object)
	}
	if got := testutil.ToFloat64(wrapResets(f.reg).WithLabelValues(resetExpired)); got != 1 {
		t.Errorf("resets expired: %v, want 1", got)
	}
}

// TestHeldBudget: what watches hold never goes over maxHeldBytes.
func TestHeldBudget(t *testing.T) {
	var b heldBudget
	if !b.take(maxHeldBytes - 10) {
		t.Fatal("the budget refused what fits")
	}
	if b.take(11) {
		t.Fatal("the budget took more than it has")
	}
	if !b.take(10) {
		t.Fatal("the budget refused what fits after a refusal")
	}
	b.give(maxHeldBytes)
	if b.n.Load() != 0 {
		t.Fatalf("after giving back all: %d", b.n.Load())
	}
}

// oneByteReader reads one byte at a time: frames split anywhere.
type oneByteReader struct{ b []byte }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	p[0], r.b = r.b[0], r.b[1:]
	return 1, nil
}

func (r *oneByteReader) Close() error { return nil }

// TestObservedBodyLeavesWhatTheCallerHolds: a watch the API server
// answers for the daemon notes its events, however its frames are split,
// and leaves what the caller holds at the last position it received.
func TestObservedBodyLeavesWhatTheCallerHolds(t *testing.T) {
	for _, ct := range contentTypes {
		t.Run(ct.name, func(t *testing.T) {
			proto := ct.name == "protobuf"
			enc := watchEncoder{f: wireFormat{protobuf: proto}, k: kindInfo{gvk: corev1.SchemeGroupVersion.WithKind("Pod"), builtin: true}}
			var body []byte
			frame := func(typ string, p *corev1.Pod) {
				b, err := enc.event(typ, podBytes(t, p, proto))
				if err != nil {
					t.Fatal(err)
				}
				body = append(body, b...)
			}
			frame("MODIFIED", podWithUID("a", "21", "ua"))
			frame("DELETED", podWithUID("b", "22", "ub"))
			frame("ADDED", podWithUID("c", "23", "uc"))
			b, err := enc.bookmark("25", false)
			if err != nil {
				t.Fatal(err)
			}
			body = append(body, b...)

			tr := &wrapTransport{left: newLeftovers(), held: &heldBudget{}}
			r := &readRequest{watch: true, resourceVersion: "20", format: wireFormat{protobuf: proto}, namespace: "ns"}
			h, err := heldFrom([][]byte{podBytes(t, podWithUID("a", "10", "ua"), proto), podBytes(t, podWithUID("b", "11", "ub"), proto)})
			if err != nil {
				t.Fatal(err)
			}
			tr.held.take(h.bytes)
			resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": []string{enc.f.contentType(true)}}, Body: &oneByteReader{body}}
			resp, err = tr.observe(r, h, resp, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			l, ok := tr.left.take(tr.pageKey(r, "25"), time.Now())
			if !ok || l.h == nil {
				t.Fatal("nothing left at the bookmark's position")
			}
			var got []string
			for _, e := range l.h.sorted() {
				got = append(got, e.k.name+" "+e.o.rv)
			}
			if want := []string{"a 21", "c 23"}; !slices.Equal(got, want) {
				t.Errorf("left %v, want %v", got, want)
			}
			if n := tr.held.n.Load(); n != 0 {
				t.Errorf("the budget still counts %d bytes once the watch left", n)
			}
		})
	}
}

package daemon_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestRejectedFieldSelectorIsQuotedShort: a 2,000-byte field selector that
// the API server rejects (400, its message quoting the field) is refused
// with INVALID_ARGUMENT that keeps the API server's words and quotes at
// most 64 bytes of the selector in one place.
func TestRejectedFieldSelectorIsQuotedShort(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn)
	selector := "spec." + strings.Repeat("x", 2000-len("spec.")-len("=v")) + "=v"
	err := firstResponse(srv.dial(t, "rejected"), client.WatchOptions{Resource: configMaps, FieldSelector: selector, ClientName: "rejected"})
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(msg, `is not a known field selector: only "metadata.name"`) {
		t.Fatalf("a field selector the API server rejects: %v; want INVALID_ARGUMENT with the API server's words", err)
	}
	for i := 0; i+64 < len(selector); i++ {
		if strings.Contains(msg, selector[i:i+65]) {
			t.Fatalf("the message (%d bytes) quotes 65 bytes of the selector, from byte %d: %.300s", len(msg), i, msg)
		}
	}
}

// TestLabelSelectorSpellingsShareOneReview: spellings of one label
// selector are one access: after the first, the others cost no
// SubjectAccessReview.
func TestLabelSelectorSpellingsShareOneReview(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn)
	c := srv.dial(t, "speller")
	for _, sel := range []string{"a=b,c!=d", "a = b , c != d", "c!=d,a=b"} {
		if err := firstResponse(c, client.WatchOptions{Resource: configMaps, LabelSelector: sel, ClientName: "speller"}); err != nil {
			t.Fatalf("label selector %q: %v", sel, err)
		}
	}
	if n := api.reviews.Load(); n != 2 {
		t.Fatalf("three spellings of one label selector cost %d SubjectAccessReviews, want 2 (list and watch, once)", n)
	}
}

// TestRestrictedIntrospectionCarriesNothingOfOthers: a caller without the
// introspection grant, served by a cluster-wide informer that another
// caller shares, sees of it only what it asked for, its state and its own
// stream; not the informer's message, which names an object of another
// namespace (refused for its size), nor its resourceVersion, counts or
// other holders.
func TestRestrictedIntrospectionCarriesNothingOfOthers(t *testing.T) {
	api := newFakeAPIServer(t)
	srv := serve(t, api, authOn, func(c *serverConfig) { c.maxObjectBytes = 1024 })
	api.denyNonResource.Store("system:serviceaccount:bench:mine", true)
	theirs := subscribe(t, srv, "theirs") // all namespaces
	theirs.waitSynced(t)
	mineClient := srv.dial(t, "mine")
	mine, err := mineClient.Stream(context.Background(), client.WatchOptions{Resource: configMaps, Namespace: "mine", ClientName: "mine"}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mine.Close)
	// In order: an object of another namespace too large to serve, then
	// one of "mine": once mine receives the second, the first was refused.
	line := func(ns, name string, rv, size int) []byte {
		return []byte(fmt.Sprintf(`{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":`+
			`{"name":%q,"namespace":%q,"uid":"u-%d","resourceVersion":"%d"},"data":{"v":%q}}}`+"\n", name, ns, rv, rv, strings.Repeat("x", size)))
	}
	api.feed <- line("other", "cm-secret", 10, 4096)
	api.feed <- line("mine", "cm-mine", 11, 10)
	for got := false; !got; {
		evs, err := mine.Recv()
		if err != nil {
			t.Fatalf("mine's stream: %v", err)
		}
		for _, ev := range evs {
			got = got || ev.GetType() == informerdv1.EventType_EVENT_TYPE_ADDED
		}
	}

	list := func(name string) []*informerdv1.Informer {
		resp, err := srv.dial(t, name).API().ListInformers(context.Background(), &informerdv1.ListInformersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetInformers()
	}
	if all := list("theirs"); len(all) != 1 || !strings.Contains(all[0].GetMessage(), "refused other/cm-secret") || len(all[0].GetSubscribers()) != 2 {
		t.Fatalf("the introspector's view: %v; want the one informer, its message naming other/cm-secret, both streams", all)
	}
	want := &informerdv1.Informer{
		Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		State:    "synced", Holders: []string{"mine"}, RefCount: 1, Encoding: informerdv1.Encoding_ENCODING_JSON,
		Subscribers: []*informerdv1.Subscriber{{
			ClientName: "mine", User: "system:serviceaccount:bench:mine",
			Peer: fmt.Sprintf("uid=%d gid=%d pid=%d", os.Getuid(), os.Getgid(), os.Getpid()),
		}},
	}
	if own := list("mine"); len(own) != 1 || !proto.Equal(own[0], want) {
		t.Fatalf("a restricted caller's view:\n%v\nwant exactly:\n%s", own, prototext.Format(want))
	}
}

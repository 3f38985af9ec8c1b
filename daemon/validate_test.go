package daemon

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// FuzzValidateWatch: any WatchRequest the wire can carry is either accepted
// or refused with INVALID_ARGUMENT; validation never panics.
func FuzzValidateWatch(f *testing.F) {
	seeds := []*informerdv1.WatchRequest{
		{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}},
		{Resource: &informerdv1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, Namespace: "ns", LabelSelector: "a in (b,c),!d", FieldSelector: "metadata.name=x", ResumeResourceVersion: "12"},
		{Kind: "Deployment", Resource: &informerdv1.GroupVersionResource{Group: "apps"}},
		{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "pods"}, LabelSelector: "app in (a", View: 7},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &informerdv1.WatchRequest{}
		if proto.Unmarshal(b, req) != nil {
			return // gRPC refuses what does not decode before a handler runs
		}
		_, _, err := validateWatch(req)
		if err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("validateWatch(%v) = %v, want nil or InvalidArgument", req, err)
		}
	})
}

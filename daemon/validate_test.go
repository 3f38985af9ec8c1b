package daemon

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// FuzzValidateWatch: any WatchRequest the wire can carry is either accepted
// or refused with INVALID_ARGUMENT (RESOURCE_EXHAUSTED for an overlong
// selector) and a short message; validation never panics.
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
		_, _, err := validateWatch(req, 4096)
		if err == nil {
			return
		}
		if c := status.Code(toStatus(err)); c != codes.InvalidArgument && c != codes.ResourceExhausted {
			t.Fatalf("validateWatch(%v) = %v, want nil, InvalidArgument or ResourceExhausted", req, err)
		}
		if len(err.Error()) > 1024 {
			t.Fatalf("validateWatch's message is %d bytes long: %.200s...", len(err.Error()), err)
		}
	})
}

// TestValidateWatchQuotesAShortPrefix: a 3.9 MiB selector is refused with
// a message of a few hundred bytes, whichever check refuses it.
func TestValidateWatchQuotesAShortPrefix(t *testing.T) {
	huge := strings.Repeat("a", 4<<20-100)
	cm := &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	for _, tt := range []struct {
		name        string
		req         *informerdv1.WatchRequest
		maxSelector int
		code        codes.Code
		contains    string
	}{
		{"over the selector limit", &informerdv1.WatchRequest{Resource: cm, LabelSelector: huge + " in (a"}, 4096, codes.ResourceExhausted, "max-selector-bytes"},
		{"invalid label selector", &informerdv1.WatchRequest{Resource: cm, LabelSelector: huge + " in (a"}, 8 << 20, codes.InvalidArgument, "label_selector"},
		{"invalid field selector", &informerdv1.WatchRequest{Resource: cm, FieldSelector: huge + "=a=b"}, 8 << 20, codes.InvalidArgument, "field_selector"},
		{"invalid resource", &informerdv1.WatchRequest{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: huge + "!"}}, 4096, codes.InvalidArgument, "resource.resource"},
		{"invalid namespace", &informerdv1.WatchRequest{Resource: cm, Namespace: huge}, 4096, codes.InvalidArgument, "namespace"},
		{"invalid resume", &informerdv1.WatchRequest{Resource: cm, ResumeResourceVersion: huge}, 4096, codes.InvalidArgument, "resume_resource_version"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := validateWatch(tt.req, tt.maxSelector)
			st := toStatus(err)
			if status.Code(st) != tt.code || !strings.Contains(st.Error(), tt.contains) || len(st.Error()) > 512 {
				t.Fatalf("got %s (%d bytes): %.300s; want %s mentioning %q in at most 512 bytes", status.Code(st), len(st.Error()), st, tt.code, tt.contains)
			}
		})
	}
}

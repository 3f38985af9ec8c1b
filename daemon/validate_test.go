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

// TestValidateWatchStatus: each malformed object is refused with
// INVALID_ARGUMENT naming its index and field, quoting at most a short
// prefix of what was sent; valid requests keep every object.
func TestValidateWatchStatus(t *testing.T) {
	ref := func(group, kind, ns, name string) *informerdv1.ObjectReference {
		return &informerdv1.ObjectReference{Group: group, Kind: kind, Namespace: ns, Name: name}
	}
	long := strings.Repeat("x", 300)
	for _, tc := range []struct {
		name string
		req  *informerdv1.WatchStatusRequest
		want string // "" for valid
	}{
		{"valid", &informerdv1.WatchStatusRequest{Objects: []*informerdv1.ObjectReference{
			ref("apps", "Deployment", "ns", "web"), ref("", "Namespace", "", "ns"), ref("rbac.authorization.k8s.io", "ClusterRole", "", "system:controller:x"),
		}}, ""},
		{"no kind", &informerdv1.WatchStatusRequest{Objects: []*informerdv1.ObjectReference{ref("", "", "ns", "a")}}, "objects[0]: kind is required"},
		{"bad group", &informerdv1.WatchStatusRequest{Objects: []*informerdv1.ObjectReference{ref("apps", "Deployment", "ns", "a"), ref("Not A Group", "X", "", "a")}}, "objects[1]: group"},
		{"bad namespace", &informerdv1.WatchStatusRequest{Objects: []*informerdv1.ObjectReference{ref("", "ConfigMap", "Bad_NS", "a")}}, "objects[0]: namespace"},
		{"no name", &informerdv1.WatchStatusRequest{Objects: []*informerdv1.ObjectReference{ref("", "ConfigMap", "ns", "")}}, "objects[0]: name is required"},
		{"long name", &informerdv1.WatchStatusRequest{Objects: []*informerdv1.ObjectReference{ref("", "ConfigMap", "ns", long)}}, "is 300 bytes long"},
		{"slash in name", &informerdv1.WatchStatusRequest{Objects: []*informerdv1.ObjectReference{ref("", "ConfigMap", "ns", "a/b")}}, "objects[0]: name"},
		{"bad strategy", &informerdv1.WatchStatusRequest{ScopeStrategy: 9}, "scope_strategy 9"},
		{"too many", &informerdv1.WatchStatusRequest{Objects: make([]*informerdv1.ObjectReference, informerdv1.MaxStatusObjects+1)}, "at most 20000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := validateWatchStatus(tc.req)
			if tc.want == "" {
				if err != nil || len(got.IDs) != len(tc.req.GetObjects()) {
					t.Fatalf("validateWatchStatus = %v, %v; want %d objects", got, err, len(tc.req.GetObjects()))
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validateWatchStatus = %v, want INVALID_ARGUMENT containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), long[:65]) {
				t.Fatalf("message quotes more than 64 bytes of the request: %v", err)
			}
		})
	}
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

// FuzzValidateWatchStatus: any WatchStatusRequest the wire can carry is
// either accepted or refused with INVALID_ARGUMENT; validation never
// panics.
func FuzzValidateWatchStatus(f *testing.F) {
	for _, s := range []*informerdv1.WatchStatusRequest{
		{Objects: []*informerdv1.ObjectReference{{Group: "apps", Kind: "Deployment", Namespace: "ns", Name: "web"}}, ScopeStrategy: 2},
		{Objects: []*informerdv1.ObjectReference{{Kind: "Namespace", Name: "x"}, {Kind: "", Name: "%"}}, ClientName: "c"},
	} {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &informerdv1.WatchStatusRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		if _, err := validateWatchStatus(req); err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("validateWatchStatus(%v) = %v, want nil or InvalidArgument", req, err)
		}
	})
}

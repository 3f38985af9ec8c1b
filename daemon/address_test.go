package daemon

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

func TestValidateWatchAddress(t *testing.T) {
	long := strings.Repeat("x", 300)
	tests := []struct {
		name string
		req  *informerdv1.WatchAddressRequest
		want string // in the INVALID_ARGUMENT message; "" for success
	}{
		{"IPv4", &informerdv1.WatchAddressRequest{Ip: "10.244.0.7", Port: 8080, LabelKeys: []string{"app", "app.kubernetes.io/name"}}, ""},
		{"IPv6", &informerdv1.WatchAddressRequest{Ip: "fd00::7", Port: 1}, ""},
		{"no IP", &informerdv1.WatchAddressRequest{Port: 80}, "ip"},
		{"host name", &informerdv1.WatchAddressRequest{Ip: "web.default", Port: 80}, "not an IP address"},
		{"zone", &informerdv1.WatchAddressRequest{Ip: "fe80::1%eth0", Port: 80}, "ip"},
		{"long garbage is quoted short", &informerdv1.WatchAddressRequest{Ip: long, Port: 80}, `"` + strings.Repeat("x", 64) + `"... (300 bytes)`},
		{"port 0", &informerdv1.WatchAddressRequest{Ip: "10.0.0.1"}, "port 0"},
		{"port too large", &informerdv1.WatchAddressRequest{Ip: "10.0.0.1", Port: 70000}, "port 70000"},
		{"bad label key", &informerdv1.WatchAddressRequest{Ip: "10.0.0.1", Port: 80, LabelKeys: []string{"not a key"}}, "label_keys"},
		{"too many label keys", &informerdv1.WatchAddressRequest{Ip: "10.0.0.1", Port: 80, LabelKeys: make([]string, 33)}, "at most 32"},
		{"long client name", &informerdv1.WatchAddressRequest{Ip: "10.0.0.1", Port: 80, ClientName: long}, "client_name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := validateWatchAddress(tt.req)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.want != "" && (status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), strings.Repeat("x", 65))):
				t.Fatalf("error = %v, want INVALID_ARGUMENT mentioning %q and quoting at most 64 bytes of the input", err, tt.want)
			}
		})
	}
}

// FuzzValidateWatchAddress: any WatchAddressRequest is either accepted or
// refused with INVALID_ARGUMENT; validation never panics.
func FuzzValidateWatchAddress(f *testing.F) {
	for _, s := range []*informerdv1.WatchAddressRequest{
		{Ip: "10.244.0.7", Port: 8080, LabelKeys: []string{"app"}, ClientName: "proxy"},
		{Ip: "::ffff:10.0.0.1", Port: 65535},
		{Ip: "fe80::1%eth0", Port: 70000, LabelKeys: []string{"a b"}},
	} {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &informerdv1.WatchAddressRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		areq, _, err := validateWatchAddress(req)
		if err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("validateWatchAddress(%v) = %v, want nil or InvalidArgument", req, err)
		}
		if err == nil && (!areq.Address.IsValid() || areq.Address.Port() == 0) {
			t.Fatalf("validateWatchAddress(%v) accepted %v", req, areq.Address)
		}
	})
}

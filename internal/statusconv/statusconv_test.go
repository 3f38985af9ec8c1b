package statusconv

import (
	"testing"

	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestEveryStatusRoundTrips: every kstatus status and every API value but
// UNSPECIFIED survive the round trip, so an enum value added on one side
// fails here until it is added to the table; the rest map to Unknown.
func TestEveryStatusRoundTrips(t *testing.T) {
	for _, s := range append(kstatus.Statuses, kstatus.NotFoundStatus) {
		if got := FromProto(ToProto(s)); got != s {
			t.Errorf("%s -> %s -> %s", s, ToProto(s), got)
		}
	}
	for v := range informerdv1.Status_name {
		p := informerdv1.Status(v)
		if p == informerdv1.Status_STATUS_UNSPECIFIED {
			continue
		}
		if got := ToProto(FromProto(p)); got != p {
			t.Errorf("%s -> %s -> %s", p, FromProto(p), got)
		}
	}
	for _, tt := range []struct {
		name string
		got  any
		want any
	}{
		{"unspecified", FromProto(informerdv1.Status_STATUS_UNSPECIFIED), kstatus.UnknownStatus},
		{"a newer daemon's value", FromProto(informerdv1.Status(99)), kstatus.UnknownStatus},
		{"a newer kstatus's status", ToProto(kstatus.Status("Exploded")), informerdv1.Status_STATUS_UNKNOWN},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

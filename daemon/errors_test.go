package daemon

import (
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/informerd/informerd/cache"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestToStatusTooNew: an informer that did not reach a resourceVersion in
// time is UNAVAILABLE (retryable), with the resourceVersions asked for and
// reached, so that WrapConfig can answer as the API server does.
func TestToStatusTooNew(t *testing.T) {
	err := fmt.Errorf("subscribing: %w", &cache.TooNewError{Want: 100, Current: 50})
	st := status.Convert(toStatus(err))
	if st.Code() != codes.Unavailable {
		t.Fatalf("code %s, want UNAVAILABLE", st.Code())
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.GetReason() != informerdv1.ReasonTooNew ||
		info.GetMetadata()[informerdv1.MetadataWantResourceVersion] != "100" || info.GetMetadata()[informerdv1.MetadataCurrentResourceVersion] != "50" {
		t.Fatalf("details %v, want %s with 100 and 50", st.Details(), informerdv1.ReasonTooNew)
	}
}

// TestToStatusCRDTerminating: a resource whose CRD is being deleted is
// UNAVAILABLE with the CRD_TERMINATING reason (WrapConfig asks the API
// server); one whose CRD is gone is NOT_FOUND.
func TestToStatusCRDTerminating(t *testing.T) {
	st := status.Convert(toStatus(fmt.Errorf("subscribing: %w: relics.example.com", cache.ErrCRDTerminating)))
	if st.Code() != codes.Unavailable {
		t.Fatalf("code %s, want UNAVAILABLE", st.Code())
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.GetDomain() != informerdv1.ErrorDomain || info.GetReason() != informerdv1.ReasonCRDTerminating {
		t.Fatalf("details %v, want %s", st.Details(), informerdv1.ReasonCRDTerminating)
	}
	if code := status.Code(toStatus(fmt.Errorf("subscribing: %w", cache.ErrResourceRemoved))); code != codes.NotFound {
		t.Fatalf("a removed resource: %s, want NOT_FOUND", code)
	}
}

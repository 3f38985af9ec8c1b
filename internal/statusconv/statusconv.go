// Package statusconv converts between kstatus statuses and the API's
// Status enum: the daemon sends them, the client library reads them, and
// both convert with this one table.
package statusconv

import (
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// statuses pairs each kstatus status with its API value.
var statuses = []struct {
	k kstatus.Status
	p informerdv1.Status
}{
	{kstatus.InProgressStatus, informerdv1.Status_STATUS_IN_PROGRESS},
	{kstatus.FailedStatus, informerdv1.Status_STATUS_FAILED},
	{kstatus.CurrentStatus, informerdv1.Status_STATUS_CURRENT},
	{kstatus.TerminatingStatus, informerdv1.Status_STATUS_TERMINATING},
	{kstatus.NotFoundStatus, informerdv1.Status_STATUS_NOT_FOUND},
	{kstatus.UnknownStatus, informerdv1.Status_STATUS_UNKNOWN},
}

// ToProto returns the API value of s; STATUS_UNKNOWN for a status the API
// does not know.
func ToProto(s kstatus.Status) informerdv1.Status {
	for _, e := range statuses {
		if e.k == s {
			return e.p
		}
	}
	return informerdv1.Status_STATUS_UNKNOWN
}

// FromProto returns the kstatus status of s; UnknownStatus for
// STATUS_UNSPECIFIED and for a value this build does not know (a newer
// daemon's).
func FromProto(s informerdv1.Status) kstatus.Status {
	for _, e := range statuses {
		if e.p == s {
			return e.k
		}
	}
	return kstatus.UnknownStatus
}

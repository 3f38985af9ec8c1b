package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// describeError says what went wrong, as kubectl does ("Error from server
// (Code): message" for the daemon's answers, "error: ..." for others), and
// what to do about it where the message does not say.
func describeError(err error, address string) string {
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.Unknown || st.Code() == codes.OK {
		return "error: " + err.Error()
	}
	msg := fmt.Sprintf("Error from server (%s): %s", st.Code(), st.Message())
	if st.Code() == codes.Unavailable { // most often not the daemon's answer: none came
		msg = fmt.Sprintf("error: informerd at %s is unavailable: %s", address, st.Message())
	}
	if h := hint(st, address); h != "" {
		msg += "\n" + h
	}
	return msg
}

// hint is the advice for an error the daemon (or gRPC) returned.
func hint(st *status.Status, address string) string {
	switch st.Code() {
	case codes.Unavailable:
		return unreachable(address)
	case codes.Unauthenticated:
		return "The daemon did not accept the caller's token: pass -token-file with a ServiceAccount token for informerd's audience " +
			"(kubectl create token SA --audience informerd > FILE)."
	case codes.PermissionDenied:
		return "Grant the caller's ServiceAccount what it lacks with RBAC (for get and watch: list and watch on the resource), " +
			"or pass -token-file with the token of one that has it."
	case codes.NotFound:
		if objectNotFound(st) {
			return ""
		}
		return "Name the resource as RESOURCE[.VERSION][.GROUP], for example configmaps, cm or deployments.apps " +
			"(kubectl api-resources lists them)."
	case codes.Unimplemented:
		return "The daemon at " + address + " is older than informerctl: upgrade informerd, or use the informerctl of its release."
	}
	return ""
}

// objectNotFound reports whether st says that an object does not exist
// (rather than its resource).
func objectNotFound(st *status.Status) bool { return hasReason(st, informerdv1.ReasonObjectNotFound) }

// hasReason reports whether st carries the daemon's ErrorInfo reason.
func hasReason(st *status.Status, reason string) bool {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == informerdv1.ErrorDomain && info.GetReason() == reason {
			return true
		}
	}
	return false
}

// unreachable says why the daemon at address may not answer.
func unreachable(address string) string {
	path, ok := strings.CutPrefix(address, "unix://")
	if !ok && !strings.HasPrefix(address, "/") {
		return fmt.Sprintf("Is informerd running and listening on %s? Set -address to where it serves.", address)
	}
	if !ok {
		path = address
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if f != nil {
		f.Close()
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("The socket %s does not exist: is informerd running on this node, and its socket directory mounted here? Set -address to its socket.", path)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Sprintf("This user may not open the socket %s: run as a user or group that may write to it.", path)
	}
	return fmt.Sprintf("Nothing answers on the socket %s: informerd is restarting or down.", path)
}

package wrapconfig

import (
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Why a request is passed through to the API server: the label values of
// informerd_client_wrap_requests_total's reason.
const (
	reasonMethod      = "method"          // not a GET: writes, and every other verb
	reasonNotList     = "not_list"        // not a collection: one object, a subresource, discovery, other paths
	reasonFormat      = "format"          // an Accept the daemon cannot answer in: as=Table, YAML, CBOR, ...
	reasonParameter   = "parameter"       // a query parameter the daemon cannot honour exactly
	reasonExactRV     = "exact_rv"        // resourceVersionMatch=Exact, or a continue token the wrapper did not issue (or no longer holds)
	reasonNotServed   = "not_served"      // the API server does not serve the resource, or not list and watch
	reasonSensitive   = "sensitive"       // the daemon does not serve the resource (-serve-sensitive)
	reasonDenied      = "denied"          // the daemon's PERMISSION_DENIED: the API server decides
	reasonRejected    = "rejected"        // the daemon's INVALID_ARGUMENT: the API server says why
	reasonExhausted   = "exhausted"       // the daemon's RESOURCE_EXHAUSTED
	reasonUnavailable = "unavailable"     // the daemon is down or cannot answer now (the outcome is fell_back)
	reasonEncoding    = "encoding"        // the daemon sent an object that cannot go in the requested format
	reasonAuth        = "unauthorized"    // the daemon's UNAUTHENTICATED: no or a bad informerd token
	reasonImpersonate = "impersonation"   // an Impersonate-* header: the daemon would read as its token, not as the impersonated user
	reasonResumeLost  = "resume_lost"     // a watch from a resourceVersion the daemon no longer holds: the API server may
	reasonOneOff      = "one_off"         // a list with a field selector, or a watch of one object, that no informer of the daemon serves: no new one for it
	reasonResumeNew   = "resume_new"      // a watch from before the informer it started: the API server serves it while the daemon keeps that informer for the next
	reasonTerminating = "crd_terminating" // the resource's CustomResourceDefinition is being deleted: the API server says when it is gone
)

// readRequest is a list or watch GET that the daemon may answer.
type readRequest struct {
	gvr       schema.GroupVersionResource
	namespace string
	watch     bool
	format    wireFormat

	labelSelector, fieldSelector string
	resourceVersion              string
	notOlderThan                 bool // resourceVersionMatch=NotOlderThan
	allowBookmarks               bool
	sendInitialEvents            *bool
	timeout                      time.Duration // timeoutSeconds (watch), timeout (list); 0: none
	limit                        int64         // a list's page size; 0: none
	cont                         string        // a list's continue token
}

// parseRead returns the readRequest of req, or the reason it is passed
// through. It accepts only what it can answer exactly: requests without
// Impersonate-* headers (cfg.Impersonate sets them), for the paths of
// collections (/api/v1[/namespaces/NS]/RESOURCE and
// /apis/GROUP/VERSION[/namespaces/NS]/RESOURCE), the query parameters of
// ListOptions that the daemon honours, and Accept headers whose first
// acceptable media type is JSON or protobuf, possibly as
// PartialObjectMetadata(List) of meta.k8s.io/v1.
func parseRead(req *http.Request) (*readRequest, string) {
	if req.Method != http.MethodGet {
		return nil, reasonMethod
	}
	for k := range req.Header {
		if strings.HasPrefix(strings.ToLower(k), "impersonate-") {
			return nil, reasonImpersonate
		}
	}
	r := &readRequest{}
	var ok bool
	if req.URL.RawPath != "" { // escaped: matched as the API server matches it, by it
		return nil, reasonNotList
	}
	if r.gvr, r.namespace, ok = parsePath(req.URL.Path); !ok {
		return nil, reasonNotList
	}
	q := req.URL.Query()
	for k := range q {
		switch k {
		case "watch", "labelSelector", "fieldSelector", "resourceVersion", "resourceVersionMatch", "allowWatchBookmarks",
			"sendInitialEvents", "timeoutSeconds", "timeout", "limit", "continue":
		default:
			return nil, reasonParameter
		}
		if len(q[k]) != 1 {
			return nil, reasonParameter
		}
	}
	r.watch, r.allowBookmarks = boolParam(q, "watch"), boolParam(q, "allowWatchBookmarks")
	if q.Has("sendInitialEvents") {
		b := boolParam(q, "sendInitialEvents")
		r.sendInitialEvents = &b
	}
	r.cont = q.Get("continue") // served if the wrapper issued it (pages.go), else passed through
	if l := q.Get("limit"); l != "" {
		n, err := strconv.ParseInt(l, 10, 64)
		if err != nil || n < 0 {
			return nil, reasonParameter
		}
		r.limit = n
	}
	r.labelSelector, r.fieldSelector, r.resourceVersion = q.Get("labelSelector"), q.Get("fieldSelector"), q.Get("resourceVersion")
	switch metav1.ResourceVersionMatch(q.Get("resourceVersionMatch")) {
	case "":
	case metav1.ResourceVersionMatchNotOlderThan:
		r.notOlderThan = true
	default:
		return nil, reasonExactRV
	}
	if r.resourceVersion != "" && r.resourceVersion != "0" {
		if _, err := strconv.ParseUint(r.resourceVersion, 10, 64); err != nil {
			return nil, reasonParameter // the API server's error for it
		}
	}
	if r.watch {
		if t := q.Get("timeoutSeconds"); t != "" {
			n, err := strconv.ParseInt(t, 10, 64)
			if err != nil || n < 0 {
				return nil, reasonParameter
			}
			r.timeout = time.Duration(n) * time.Second
		}
		// The API server ignores ?timeout= on watches (client-go sends it
		// with timeoutSeconds).
		if q.Has("limit") || q.Has("continue") {
			return nil, reasonParameter
		}
		switch {
		case r.sendInitialEvents != nil && *r.sendInitialEvents:
			// WatchList: the API server requires both.
			if !r.notOlderThan || !r.allowBookmarks {
				return nil, reasonParameter
			}
		case r.notOlderThan:
			return nil, reasonParameter // NotOlderThan is for lists, and WatchList
		}
	} else {
		if q.Has("timeoutSeconds") || q.Has("allowWatchBookmarks") || q.Has("sendInitialEvents") {
			return nil, reasonParameter
		}
		if r.cont != "" && (r.resourceVersion != "" || q.Has("resourceVersionMatch")) {
			return nil, reasonParameter // the API server refuses a resourceVersion with a continue token
		}
		if r.notOlderThan && (r.resourceVersion == "" || r.resourceVersion == "0") {
			return nil, reasonParameter // the API server refuses NotOlderThan without a resourceVersion
		}
		if t := q.Get("timeout"); t != "" {
			d, err := time.ParseDuration(t)
			if err != nil || d < 0 {
				return nil, reasonParameter
			}
			r.timeout = d
		}
	}
	if r.format, ok = negotiate(req.Header.Values("Accept"), r.watch); !ok {
		return nil, reasonFormat
	}
	return r, ""
}

// boolParam reads a boolean query parameter as the API server does
// (apimachinery's Convert_Slice_string_To_bool): absent, "0" and "false"
// in any case are false; every other value, "" and "f" included, is true.
func boolParam(q url.Values, k string) bool {
	v, ok := q[k]
	return ok && len(v) > 0 && v[0] != "0" && !strings.EqualFold(v[0], "false")
}

// parsePath returns the resource and namespace of a collection's path. It
// matches paths as the API server's mux does, segment by segment: a path
// with an empty, "." or ".." segment (//api/v1/pods, /api/v1/pods/) is not
// a collection's, whatever the API server answers for it.
func parsePath(path string) (gvr schema.GroupVersionResource, namespace string, ok bool) {
	rest, ok := strings.CutPrefix(path, "/")
	if !ok {
		return gvr, "", false
	}
	parts := strings.Split(rest, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return gvr, "", false
		}
	}
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		gvr.Version, parts = parts[1], parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		gvr.Group, gvr.Version, parts = parts[1], parts[2], parts[3:]
	default:
		return gvr, "", false
	}
	if len(parts) == 3 && parts[0] == "namespaces" {
		namespace, parts = parts[1], parts[2:]
		if namespace == "" || parts[0] == "status" || parts[0] == "finalize" { // a Namespace's subresources
			return gvr, "", false
		}
	}
	if len(parts) != 1 || parts[0] == "" || gvr.Version == "" || parts[0] == "watch" || parts[0] == "proxy" {
		return gvr, "", false
	}
	gvr.Resource = parts[0]
	return gvr, namespace, true
}

// negotiate picks the format of the response from the Accept headers, as
// the API server would: the first media type it serves, in order of
// preference. ok is false when that is one the daemon cannot answer in
// (YAML, CBOR, as=Table, ...), or when there is none.
func negotiate(accept []string, watch bool) (f wireFormat, ok bool) {
	type choice struct {
		mediaType string
		params    map[string]string
		q         float64
	}
	var choices []choice
	for _, h := range accept {
		for _, part := range strings.Split(h, ",") {
			if strings.TrimSpace(part) == "" {
				continue
			}
			mt, params, err := mime.ParseMediaType(part)
			if err != nil {
				continue
			}
			c := choice{mediaType: mt, params: params, q: 1}
			if qs, ok := params["q"]; ok {
				if c.q, err = strconv.ParseFloat(qs, 64); err != nil {
					continue
				}
				delete(params, "q")
			}
			if c.q > 0 {
				choices = append(choices, c)
			}
		}
	}
	if len(choices) == 0 {
		return wireFormat{}, true // no Accept: JSON
	}
	// Stable: equal preferences keep the client's order.
	for i := 1; i < len(choices); i++ {
		for j := i; j > 0 && choices[j].q > choices[j-1].q; j-- {
			choices[j], choices[j-1] = choices[j-1], choices[j]
		}
	}
	for i, c := range choices {
		switch c.mediaType {
		case mediaJSON, mediaProtobuf:
			f.protobuf = c.mediaType == mediaProtobuf
		case "*/*", "application/*":
			f.protobuf = false
		default:
			if strings.HasPrefix(c.mediaType, "application/") && !strings.Contains(c.mediaType, "*") {
				// yaml, cbor, ...: the API server may serve it, the daemon does not
				if c.mediaType == "application/yaml" || c.mediaType == "application/cbor" || c.mediaType == "application/cbor-seq" {
					return f, false
				}
			}
			continue
		}
		as := c.params["as"]
		delete(c.params, "as")
		g, v := c.params["g"], c.params["v"]
		delete(c.params, "g")
		delete(c.params, "v")
		delete(c.params, "stream") // a client may name the watch framing
		if len(c.params) > 0 {
			return f, false
		}
		switch as {
		case "":
			if g != "" || v != "" {
				return f, false
			}
			for _, later := range choices[i+1:] {
				if _, as := later.params["as"]; !as && (later.mediaType == mediaJSON || later.mediaType == "*/*" || later.mediaType == "application/*") {
					f.jsonFallback = true
				}
			}
			return f, true
		case "PartialObjectMetadata", "PartialObjectMetadataList":
			if g != metav1.GroupName || v != "v1" || (as == "PartialObjectMetadataList") == watch {
				return f, false
			}
			f.metadata = true
			return f, true
		}
		return f, false // as=Table, ...
	}
	return f, false
}

package wrapconfig

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Read your writes. A list or watch served after a write that this
// config passed through reflects the write:
//
//   - A write answered with an object (create, update, patch, a delete
//     that returns the deleted object or one with a deletionTimestamp, a
//     subresource such as status or scale) carries the resourceVersion of
//     the change, which the daemon's informers of the resource in that
//     namespace, and cluster-wide, will reach with its event: it raises
//     their floor (freshness.floors), and a read waits for it
//     (WatchOptions.NotOlderThan).
//   - An informer with a field selector may never receive the event (the
//     object may not match): a read through it is served only if its
//     snapshot is at least as new as the write, and passed through
//     otherwise (freshness.writes).
//   - A delete answered with a Status (most built-in kinds: the API server
//     returns the deleted object only for some) carries no
//     resourceVersion, only the object's uid: until a full list of the
//     namespace shows it gone (or for pendingTTL), a list that still holds
//     the uid waits for the informer's next change and looks again, and a
//     watch with initial events passes through (freshness.pending).
//
// Floors are kept per informer the daemon can have, the wire format
// included (a protobuf informer and a JSON one of the same resource are
// two), never per request: a label selector reads the same informer as
// none, and a floor raised by one format's reads never makes a read of
// the other wait for an informer that has no reason to move.

// scope names one informer of the daemon as the wrapper can tell them
// apart: what it serves a request from. The daemon may serve a namespace
// from a cluster-wide informer; floors are kept per namespace anyway,
// which is at least as strict.
type scope struct {
	gvr                      schema.GroupVersionResource
	namespace, fieldSelector string
	protobuf                 bool
}

// place is a resource in a namespace ("" for cluster-wide, or a
// cluster-scoped resource).
type place struct {
	gvr       schema.GroupVersionResource
	namespace string
}

// pendingDelete is a deletion whose resourceVersion is unknown.
type pendingDelete struct {
	namespace string
	uid       string
	at        time.Time
}

// reasonStale: the daemon's informer has not shown this config's own
// write yet, and may never (a field selector), or not within
// freshnessRetry.
const reasonStale = "stale"

const (
	// maxTracked bounds every table of freshness (entries, LRU).
	maxTracked = 4096
	// maxPending bounds the deletions pending per resource; older ones
	// are forgotten first.
	maxPending = 64
	// pendingTTL is how long a deletion without a resourceVersion is
	// checked for. An informer sees a deletion within its watch latency;
	// this is far past it.
	pendingTTL = time.Minute
	// maxWriteBody bounds the bytes of a write's response read for its
	// resourceVersion (etcd refuses objects over 1.5 MiB by default); a
	// larger response raises no floor.
	maxWriteBody = 8 << 20
	// freshnessRetry bounds how long a list waits for a pending deletion
	// to reach the daemon before it passes through.
	freshnessRetry = 3 * time.Second
)

// freshness is what one wrapped config has served and written, shared by
// every transport made from it. Safe for concurrent use.
type freshness struct {
	// floors: per informer, the newest resourceVersion it served, or that
	// a write of its scope made (which its own events reach).
	floors *lru.Cache[scope, uint64]
	// writes: the newest write's resourceVersion per resource and
	// namespace, and per resource cluster-wide ("").
	writes *lru.Cache[place, uint64]

	mu      sync.Mutex // guards pending
	pending map[schema.GroupVersionResource][]pendingDelete
}

func newFreshness() *freshness {
	floors, _ := lru.New[scope, uint64](maxTracked) // a positive size: cannot fail
	writes, _ := lru.New[place, uint64](maxTracked)
	return &freshness{floors: floors, writes: writes, pending: map[schema.GroupVersionResource][]pendingDelete{}}
}

// raise raises the floor of sc to rv.
func (f *freshness) raise(sc scope, rv uint64) {
	if old, ok := f.floors.Get(sc); !ok || rv > old {
		f.floors.Add(sc, rv)
	}
}

// floor returns the resourceVersion a read of sc must not be older than.
func (f *freshness) floor(sc scope) uint64 {
	n, _ := f.floors.Get(sc)
	return n
}

// written returns the newest write that a read of sc must reflect.
func (f *freshness) written(sc scope) uint64 {
	n, _ := f.writes.Get(place{sc.gvr, sc.namespace})
	return n
}

// wrote records a write of gvr in namespace at resourceVersion rv.
func (f *freshness) wrote(gvr schema.GroupVersionResource, namespace string, rv uint64) {
	for _, ns := range []string{namespace, ""} {
		p := place{gvr, ns}
		if old, ok := f.writes.Get(p); !ok || rv > old {
			f.writes.Add(p, rv)
		}
		for _, pb := range []bool{false, true} {
			f.raise(scope{gvr: gvr, namespace: ns, protobuf: pb}, rv)
		}
		if ns == "" {
			break
		}
	}
}

// deleted records a deletion of the object uid in namespace whose
// resourceVersion is unknown.
func (f *freshness) deleted(gvr schema.GroupVersionResource, namespace, uid string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ps := append(f.live(gvr, now), pendingDelete{namespace: namespace, uid: uid, at: now})
	if len(ps) > maxPending {
		ps = ps[len(ps)-maxPending:]
	}
	f.pending[gvr] = ps
	if len(f.pending) > maxTracked { // forget resources whose deletions all lapsed
		for g := range f.pending {
			if len(f.live(g, now)) == 0 {
				delete(f.pending, g)
			}
		}
	}
}

// live returns gvr's pending deletions younger than pendingTTL; f.mu held.
func (f *freshness) live(gvr schema.GroupVersionResource, now time.Time) []pendingDelete {
	ps := f.pending[gvr]
	i := 0
	for i < len(ps) && now.Sub(ps[i].at) >= pendingTTL {
		i++
	}
	return ps[i:]
}

// pendingIn returns the uids of the pending deletions a read of sc
// covers.
func (f *freshness) pendingIn(sc scope, now time.Time) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var uids []string
	for _, p := range f.live(sc.gvr, now) {
		if sc.namespace == "" || p.namespace == sc.namespace {
			uids = append(uids, p.uid)
		}
	}
	return uids
}

// check returns the pending deletions a read of sc covers that objs
// still hold. When objs are all of the informer's objects in sc's
// namespace (whole, and no field selector), the pending deletions they
// do not hold have reached it, and are forgotten.
func (f *freshness) check(sc scope, whole bool, objs [][]byte) []string {
	uids := f.pendingIn(sc, time.Now())
	if len(uids) == 0 {
		return nil
	}
	held := holding(objs, uids)
	if whole && sc.fieldSelector == "" {
		var gone []string
		for _, u := range uids {
			if !contains(held, u) {
				gone = append(gone, u)
			}
		}
		f.seenGone(sc.gvr, gone)
	}
	return held
}

// seenGone forgets the pending deletions of uids.
func (f *freshness) seenGone(gvr schema.GroupVersionResource, uids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ps := f.pending[gvr]
	out := ps[:0:0]
	for _, p := range ps {
		if !contains(uids, p.uid) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		delete(f.pending, gvr)
		return
	}
	f.pending[gvr] = out
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// holding returns the uids among uids of objects in objs (as the daemon
// sent them, JSON or protobuf). Only an object whose bytes contain a uid
// is decoded, to tell its own uid from a reference to another's.
func holding(objs [][]byte, uids []string) []string {
	var held []string
	for _, uid := range uids {
		u := []byte(uid)
		for _, o := range objs {
			if bytes.Contains(o, u) && objectUID(o) == uid {
				held = append(held, uid)
				break
			}
		}
	}
	return held
}

// objectUID returns the uid of an object as the daemon sent it, or "".
func objectUID(b []byte) string {
	m, ok := writeMeta(b)
	if !ok || m.status {
		return ""
	}
	return m.uid
}

// noteWrite reads the response of a write of req that passed through,
// and records what it changed. It returns resp with its body intact.
func (f *freshness) noteWrite(req *http.Request, resp *http.Response) *http.Response {
	if resp == nil || resp.StatusCode < 200 || resp.StatusCode > 299 || resp.Body == nil || req.URL.Query().Has("dryRun") {
		return resp // a dry run changes nothing
	}
	gvr, namespace, ok := parseWritePath(req.Method, req.URL.Path)
	if !ok {
		return resp
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxWriteBody+1))
	rest := resp.Body
	resp.Body = readCloser{io.MultiReader(bytes.NewReader(body), rest), rest}
	if err != nil || len(body) > maxWriteBody {
		return resp
	}
	m, ok := writeMeta(body)
	if !ok {
		return resp
	}
	switch {
	case m.resourceVersion != "":
		if rv, err := strconv.ParseUint(m.resourceVersion, 10, 64); err == nil {
			f.wrote(gvr, namespace, rv)
		}
	case m.status && req.Method == http.MethodDelete && m.uid != "":
		f.deleted(gvr, namespace, m.uid, time.Now())
	}
	return resp
}

type readCloser struct {
	io.Reader
	io.Closer
}

// parseWritePath returns the resource and namespace a write's path
// changes: a collection (create) or one object, or one of its
// subresources that changes it. ok is false for other paths (discovery,
// connections such as exec and proxy, a collection's deletion).
func parseWritePath(method, path string) (gvr schema.GroupVersionResource, namespace string, ok bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		gvr.Version, parts = parts[1], parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		gvr.Group, gvr.Version, parts = parts[1], parts[2], parts[3:]
	default:
		return gvr, "", false
	}
	isNamespaceSub := len(parts) == 3 && (parts[2] == "status" || parts[2] == "finalize")
	if len(parts) >= 3 && parts[0] == "namespaces" && !isNamespaceSub {
		namespace, parts = parts[1], parts[2:]
	}
	if len(parts) == 0 || len(parts) > 3 || parts[0] == "" {
		return gvr, "", false
	}
	if len(parts) == 1 && method == http.MethodDelete {
		return gvr, "", false // a collection's deletion answers with a list (or a Status) that dates none of them
	}
	if len(parts) == 3 {
		switch parts[2] {
		case "exec", "attach", "portforward", "proxy", "log", "token", "eviction", "binding":
			return gvr, "", false // no object of the resource in the answer
		}
	}
	gvr.Resource = parts[0]
	return gvr, namespace, true
}

// writtenMeta is what a write's response says of the change.
type writtenMeta struct {
	resourceVersion string
	status          bool   // a Status, not an object
	uid             string // a Status's details.uid, or the object's
}

// writeMeta reads a write's response, JSON or protobuf.
func writeMeta(b []byte) (writtenMeta, bool) {
	if isProtobuf(b) {
		var u runtime.Unknown
		if u.Unmarshal(b[len(protobufMagic):]) != nil {
			return writtenMeta{}, false
		}
		if u.Kind == "Status" {
			var st metav1.Status
			if st.Unmarshal(u.Raw) != nil || st.Details == nil {
				return writtenMeta{}, false
			}
			return writtenMeta{status: true, uid: string(st.Details.UID)}, true
		}
		// Every built-in kind has its ObjectMeta as field 1, as
		// PartialObjectMetadata does (protobufLayout).
		var pom metav1.PartialObjectMetadata
		if pom.Unmarshal(u.Raw) != nil {
			return writtenMeta{}, false
		}
		return writtenMeta{resourceVersion: pom.ResourceVersion, uid: string(pom.UID)}, true
	}
	var j struct {
		Kind     string `json:"kind"`
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
			UID             string `json:"uid"`
		} `json:"metadata"`
		Details *struct {
			UID string `json:"uid"`
		} `json:"details"`
	}
	if json.Unmarshal(b, &j) != nil {
		return writtenMeta{}, false
	}
	if j.Kind == "Status" {
		if j.Details == nil {
			return writtenMeta{}, false
		}
		return writtenMeta{status: true, uid: j.Details.UID}, true
	}
	return writtenMeta{resourceVersion: j.Metadata.ResourceVersion, uid: j.Metadata.UID}, true
}

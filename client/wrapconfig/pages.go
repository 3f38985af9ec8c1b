package wrapconfig

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Pagination. A list with limit=N (and a resourceVersion other than "0",
// which the API server answers whole) is answered with its first N
// objects and, when more remain, a continue token in the API server's own
// format (k8s.io/apiserver/pkg/storage's EncodeContinue: base64url of
// {"v":"meta.k8s.io/v1","rv":RV,"start":"KEY\u0000"}, KEY the last
// object's storage key under the request's prefix, "/namespace/name" or
// "/name"). The rest of the snapshot is kept in a bounded cache for
// pageTTL, so that every page comes from the same snapshot at the list's
// resourceVersion. A continue token the cache does not hold (the API
// server's, or one of ours whose snapshot is gone) passes through: the
// API server serves the rest at that resourceVersion, consistently, or
// answers 410 Expired itself.
//
// remainingItemCount is sent as the API server sends it: only for a list
// without selectors. With a selector the API server may send a token
// whose next page is empty (it counts objects it scanned, not matched);
// the daemon, which holds only the matching objects, sends none once
// none remain.

const (
	// pageTTL is how long a paginated list's snapshot is kept: well
	// inside etcd's compaction interval (5 minutes by default), so that a
	// token the API server would have expired is passed to it.
	pageTTL = time.Minute
	// maxPageBytes bounds the bytes of the snapshots kept for pages, per
	// wrapped config; the least recently used go first.
	maxPageBytes = 64 << 20
)

// pageKey identifies a paginated list's snapshot: the request's shape
// and the list's resourceVersion.
type pageKey struct {
	gvr                          schema.GroupVersionResource
	namespace                    string
	labelSelector, fieldSelector string
	format                       wireFormat
	rv                           string
}

// pagedList is the snapshot of a paginated list.
type pagedList struct {
	objs [][]byte

	mu     sync.Mutex     // guards starts
	starts map[string]int // the start keys of the tokens issued: the index of the next object
}

// pageCache holds the snapshots of paginated lists, bounded by bytes,
// each for pageTTL.
type pageCache = ttlCache[pageKey, *pagedList]

func newPageCache() *pageCache { return newTTLCache[pageKey, *pagedList](pageTTL, maxPageBytes) }

// continueToken is the API server's continue token
// (k8s.io/apiserver/pkg/storage.continueToken).
type continueToken struct {
	APIVersion      string `json:"v"`
	ResourceVersion int64  `json:"rv"`
	StartKey        string `json:"start"`
}

// encodeContinue returns the token that continues after the object whose
// storage key under the request's prefix is key, at rv.
func encodeContinue(key string, rv int64) string {
	b, _ := json.Marshal(continueToken{APIVersion: "meta.k8s.io/v1", ResourceVersion: rv, StartKey: key + "\x00"}) // cannot fail
	return base64.RawURLEncoding.EncodeToString(b)
}

// decodeContinue reads a continue token; ok is false for one not in the
// API server's format (which the API server then refuses itself).
func decodeContinue(s string) (rv, start string, ok bool) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return "", "", false
	}
	var t continueToken
	if json.Unmarshal(b, &t) != nil || t.APIVersion != "meta.k8s.io/v1" || t.ResourceVersion <= 0 || t.StartKey == "" {
		return "", "", false
	}
	return strconv.FormatInt(t.ResourceVersion, 10), t.StartKey, true
}

// storageKey returns the key of the object b (as the daemon sent it)
// under the prefix of a request in namespace, as the API server's
// tokens have it (its prefix has no trailing slash): "/name" within a
// namespace or for a cluster-scoped object, "/namespace/name" across
// namespaces.
func storageKey(b []byte, namespace string) (string, error) {
	m, err := readMeta(b)
	if err != nil {
		return "", err
	}
	if m.name == "" {
		return "", errors.New("an object without a name")
	}
	if namespace != "" || m.namespace == "" {
		return "/" + m.name, nil
	}
	return "/" + m.namespace + "/" + m.name, nil
}

// listPage is one page of a list: its objects and its ListMeta.
type listPage struct {
	objs      [][]byte
	cont      string
	remaining *int64
}

// page returns the page of l's snapshot that starts at index from, of at
// most limit objects (0: all), with the token of the next if any,
// recorded in l. selectors: the request has a label or field selector
// (no remainingItemCount).
func (l *pagedList) page(from int, limit int64, rv string, namespace string, selectors bool) (listPage, error) {
	rest := l.objs[from:]
	if limit <= 0 || int64(len(rest)) <= limit {
		return listPage{objs: rest}, nil
	}
	p := listPage{objs: rest[:limit]}
	key, err := storageKey(p.objs[len(p.objs)-1], namespace)
	if err != nil {
		return listPage{}, err
	}
	n, err := strconv.ParseInt(rv, 10, 64)
	if err != nil || n <= 0 {
		return listPage{}, errors.New("a list without a numeric resourceVersion cannot be paginated")
	}
	p.cont = encodeContinue(key, n)
	if !selectors {
		remaining := int64(len(rest)) - limit
		p.remaining = &remaining
	}
	l.mu.Lock()
	if l.starts == nil {
		l.starts = map[string]int{}
	}
	l.starts[key+"\x00"] = from + int(limit)
	l.mu.Unlock()
	return p, nil
}

// next returns the index that a token with start continues at, if l
// issued it.
func (l *pagedList) next(start string) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.starts[start]
	return i, ok
}

func sizeOf(objs [][]byte) int64 {
	var n int64
	for _, b := range objs {
		n += int64(len(b)) + 24 // the slice header
	}
	return n
}

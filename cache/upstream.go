package cache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// upstream lists and watches one Key on the API server.
type upstream interface {
	// list returns every object and the resourceVersion of the list.
	list(ctx context.Context) (objs []*Object, rv string, err error)
	// watch opens a watch after resourceVersion rv, with bookmarks.
	watch(ctx context.Context, rv string) (watchStream, error)
}

// watchStream yields watch events until it fails or is closed.
type watchStream interface {
	// next blocks for the next event. A Bookmark carries only rv.
	next() (t EventType, obj *Object, rv string, err error)
	close()
}

// restUpstream talks to the API server with raw JSON, so that objects are
// never decoded into maps.
type restUpstream struct {
	client    rest.Interface
	path      string // collection path, e.g. /apis/apps/v1/namespaces/ns/deployments
	fieldSel  string
	pageSize  int64
	timeout   time.Duration // per LIST page; idle time of a WatchList
	stripMF   bool
	watchList bool // try WatchList (sendInitialEvents) before LIST
}

var _ upstream = (*restUpstream)(nil)

func collectionPath(k Key) string {
	p := "/apis/" + k.GVR.Group + "/" + k.GVR.Version
	if k.GVR.Group == "" {
		p = "/api/" + k.GVR.Version
	}
	if k.Namespace != "" {
		p += "/namespaces/" + url.PathEscape(k.Namespace)
	}
	return p + "/" + k.GVR.Resource
}

// errWatchListUnsupported says the server refused sendInitialEvents.
var errWatchListUnsupported = errors.New("server does not support WatchList")

func (u *restUpstream) list(ctx context.Context) ([]*Object, string, error) {
	if u.watchList {
		objs, rv, err := u.listByWatch(ctx)
		if !errors.Is(err, errWatchListUnsupported) {
			return objs, rv, err
		}
		u.watchList = false
	}
	var objs []*Object
	cont := ""
	for {
		req := u.client.Get().AbsPath(u.path).Param("limit", strconv.FormatInt(u.pageSize, 10))
		if u.fieldSel != "" {
			req = req.Param("fieldSelector", u.fieldSel)
		}
		if cont != "" {
			req = req.Param("continue", cont)
		}
		pageCtx, cancel := context.WithTimeout(ctx, u.timeout)
		body, err := req.DoRaw(pageCtx)
		cancel()
		if err != nil {
			return nil, "", err
		}
		var page struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Metadata   metav1.ListMeta   `json:"metadata"`
			Items      []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, "", fmt.Errorf("decoding list of %s: %w", u.path, err)
		}
		// The items of a list omit apiVersion and kind: they are the list's.
		itemType := []byte(fmt.Sprintf(`{"apiVersion":%q,"kind":%q,`, page.APIVersion, strings.TrimSuffix(page.Kind, "List")))
		for _, raw := range page.Items {
			raw, err := withTypeMeta(raw, itemType)
			if err != nil {
				return nil, "", fmt.Errorf("decoding list of %s: %w", u.path, err)
			}
			o, err := decodeObject(raw, u.stripMF)
			if err != nil {
				return nil, "", err
			}
			objs = append(objs, o)
		}
		if page.Metadata.Continue == "" {
			return objs, page.Metadata.ResourceVersion, nil
		}
		cont = page.Metadata.Continue
	}
}

// listByWatch performs a WatchList: a watch that first streams every object
// and then a bookmark marking the end of the initial events.
func (u *restUpstream) listByWatch(ctx context.Context) ([]*Object, string, error) {
	ctx, touch, idle, stop := idleContext(ctx, u.timeout)
	defer stop()
	req := u.client.Get().AbsPath(u.path).
		Param("watch", "true").
		Param("sendInitialEvents", "true").
		Param("resourceVersionMatch", string(metav1.ResourceVersionMatchNotOlderThan)).
		Param("allowWatchBookmarks", "true")
	if u.fieldSel != "" {
		req = req.Param("fieldSelector", u.fieldSel)
	}
	body, err := req.Stream(ctx)
	if err != nil {
		if apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) {
			return nil, "", fmt.Errorf("%w: %w", errWatchListUnsupported, err)
		}
		return nil, "", idleErr(err, idle)
	}
	ws := newJSONWatchStream(body, u.stripMF)
	defer ws.close()
	var objs []*Object
	for {
		t, obj, rv, err := ws.next()
		if err != nil {
			return nil, "", idleErr(err, idle)
		}
		touch()
		switch t {
		case Added:
			objs = append(objs, obj)
		case Bookmark:
			if ws.lastInitialEventsEnd {
				return objs, rv, nil
			}
		default:
			return nil, "", fmt.Errorf("unexpected %s event during the initial events of %s", t, u.path)
		}
	}
}

func (u *restUpstream) watch(ctx context.Context, rv string) (watchStream, error) {
	req := u.client.Get().AbsPath(u.path).
		Param("watch", "true").
		Param("resourceVersion", rv).
		Param("allowWatchBookmarks", "true").
		Param("timeoutSeconds", strconv.Itoa(watchTimeoutSeconds()))
	if u.fieldSel != "" {
		req = req.Param("fieldSelector", u.fieldSel)
	}
	body, err := req.Stream(ctx)
	if err != nil {
		return nil, err
	}
	return newJSONWatchStream(body, u.stripMF), nil
}

// jsonWatchStream decodes a JSON watch response body.
type jsonWatchStream struct {
	body    io.ReadCloser
	dec     *json.Decoder
	stripMF bool
	// lastInitialEventsEnd is set when the last Bookmark ended a
	// WatchList's initial events.
	lastInitialEventsEnd bool
}

func newJSONWatchStream(body io.ReadCloser, stripMF bool) *jsonWatchStream {
	return &jsonWatchStream{body: body, dec: json.NewDecoder(body), stripMF: stripMF}
}

func (w *jsonWatchStream) close() { w.body.Close() }

func (w *jsonWatchStream) next() (EventType, *Object, string, error) {
	var frame struct {
		Type   string          `json:"type"`
		Object json.RawMessage `json:"object"`
	}
	if err := w.dec.Decode(&frame); err != nil {
		return 0, nil, "", err
	}
	var t EventType
	switch frame.Type {
	case "ADDED":
		t = Added
	case "MODIFIED":
		t = Modified
	case "DELETED":
		t = Deleted
	case "BOOKMARK":
		var h struct {
			Metadata struct {
				ResourceVersion string            `json:"resourceVersion"`
				Annotations     map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(frame.Object, &h); err != nil {
			return 0, nil, "", fmt.Errorf("decoding bookmark: %w", err)
		}
		w.lastInitialEventsEnd = h.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true"
		return Bookmark, nil, h.Metadata.ResourceVersion, nil
	case "ERROR":
		var st metav1.Status
		if err := json.Unmarshal(frame.Object, &st); err != nil {
			return 0, nil, "", fmt.Errorf("decoding watch error: %w", err)
		}
		return 0, nil, "", &apierrors.StatusError{ErrStatus: st}
	default:
		return 0, nil, "", fmt.Errorf("unknown watch event type %q", frame.Type)
	}
	obj, err := decodeObject(frame.Object, w.stripMF)
	if err != nil {
		return 0, nil, "", err
	}
	return t, obj, obj.ResourceVersion, nil
}

// withTypeMeta returns raw with apiVersion and kind prepended from
// typeMeta (`{"apiVersion":...,"kind":...,`) unless it has a kind already.
func withTypeMeta(raw, typeMeta []byte) ([]byte, error) {
	var h struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, err
	}
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if h.Kind != "" || len(raw) < 2 || raw[0] != '{' {
		return raw, nil
	}
	rest := bytes.TrimLeft(raw[1:], " \t\r\n")
	out := make([]byte, 0, len(typeMeta)+len(raw))
	out = append(out, typeMeta...)
	if len(rest) > 0 && rest[0] == '}' { // an empty object
		return append(out[:len(out)-1], rest...), nil
	}
	return append(out, rest...), nil
}

// decodeObject reads the metadata of one JSON object and, if strip is set,
// removes metadata.managedFields from its bytes. The Object keeps raw, which
// the caller must own and not modify (json.RawMessage fields are copies).
func decodeObject(raw []byte, strip bool) (*Object, error) {
	var h struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Namespace       string            `json:"namespace"`
			Name            string            `json:"name"`
			UID             string            `json:"uid"`
			ResourceVersion string            `json:"resourceVersion"`
			Labels          map[string]string `json:"labels"`
			ManagedFields   json.RawMessage   `json:"managedFields"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("decoding object: %w", err)
	}
	o := &Object{
		Namespace: h.Metadata.Namespace, Name: h.Metadata.Name, UID: h.Metadata.UID,
		ResourceVersion: h.Metadata.ResourceVersion, Labels: h.Metadata.Labels,
		APIVersion: h.APIVersion, Kind: h.Kind, JSON: raw,
	}
	if strip && len(h.Metadata.ManagedFields) > 0 && !bytes.Equal(h.Metadata.ManagedFields, []byte("null")) {
		stripped, err := withoutManagedFields(raw)
		if err != nil {
			return nil, err
		}
		o.JSON = stripped
	}
	return o, nil
}

func withoutManagedFields(raw []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, err
	}
	var meta map[string]json.RawMessage
	if err := json.Unmarshal(top["metadata"], &meta); err != nil {
		return nil, err
	}
	delete(meta, "managedFields")
	m, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	top["metadata"] = m
	return json.Marshal(top)
}

// watchTimeoutSeconds spreads watch lifetimes over 5-10 minutes, as the
// reflector does, so that many Sources do not re-watch in step.
func watchTimeoutSeconds() int { return 300 + rand.IntN(300) }

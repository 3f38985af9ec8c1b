package cache

import (
	"bufio"
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
		kind := strings.TrimSuffix(page.Kind, "List")
		itemType := []byte(fmt.Sprintf(`{"apiVersion":%q,"kind":%q,`, page.APIVersion, kind))
		for _, raw := range page.Items {
			o, err := decodeObject(raw, u.stripMF)
			if err != nil {
				return nil, "", fmt.Errorf("decoding list of %s: %w", u.path, err)
			}
			objs = append(objs, withTypeMeta(o, page.APIVersion, kind, itemType))
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

// jsonWatchStream decodes a JSON watch response body: a sequence of
// {"type":...,"object":...} values, which the API server ends with newlines.
type jsonWatchStream struct {
	body    io.ReadCloser
	r       *bufio.Reader
	buf     []byte // read, not yet consumed: the start of the next frame
	stripMF bool
	// lastInitialEventsEnd is set when the last Bookmark ended a
	// WatchList's initial events.
	lastInitialEventsEnd bool
}

func newJSONWatchStream(body io.ReadCloser, stripMF bool) *jsonWatchStream {
	return &jsonWatchStream{body: body, r: bufio.NewReaderSize(body, 64<<10), stripMF: stripMF}
}

func (w *jsonWatchStream) close() { w.body.Close() }

// maxFrameBytes bounds one watch event: far above any object the API
// server stores (etcd refuses requests over 1.5 MiB by default).
const maxFrameBytes = 64 << 20

// frame returns the next top-level JSON value, valid until the next call.
func (w *jsonWatchStream) frame() ([]byte, error) {
	for {
		if start := bytes.TrimLeft(w.buf, " \t\r\n"); len(start) > 0 {
			s := &scanner{b: start}
			err := s.skip()
			if err == nil {
				w.buf = start[s.i:]
				return start[:s.i], nil
			}
			if !errors.Is(err, errTruncated) {
				return nil, err
			}
		} else {
			w.buf = w.buf[:0] // consumed: reuse the array
		}
		if len(w.buf) > maxFrameBytes {
			return nil, fmt.Errorf("watch event larger than %d bytes", maxFrameBytes)
		}
		// Read up to the next newline, which ends a frame unless the
		// sender indents its JSON.
		for {
			line, err := w.r.ReadSlice('\n')
			w.buf = append(w.buf, line...)
			switch {
			case errors.Is(err, bufio.ErrBufferFull):
				continue
			case errors.Is(err, io.EOF) && len(bytes.TrimSpace(w.buf)) > 0:
				return nil, io.ErrUnexpectedEOF
			case err != nil:
				return nil, err
			}
			break
		}
	}
}

func (w *jsonWatchStream) next() (EventType, *Object, string, error) {
	b, err := w.frame()
	if err != nil {
		return 0, nil, "", err
	}
	s := &scanner{b: b}
	typ, obj := "", []byte(nil)
	err = s.fields(func() error {
		k, err := s.member("type", "object")
		switch {
		case err != nil:
			return err
		case k == 0:
			typ, err = s.optText()
			return err
		case k == 1:
			start := s.i
			err = s.skip()
			obj = b[start:s.i]
			return err
		}
		return s.skip()
	})
	if err != nil {
		return 0, nil, "", fmt.Errorf("decoding watch event: %w", err)
	}
	var t EventType
	switch typ {
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
		if err := json.Unmarshal(obj, &h); err != nil {
			return 0, nil, "", fmt.Errorf("decoding bookmark: %w", err)
		}
		w.lastInitialEventsEnd = h.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true"
		return Bookmark, nil, h.Metadata.ResourceVersion, nil
	case "ERROR":
		var st metav1.Status
		if err := json.Unmarshal(obj, &st); err != nil {
			return 0, nil, "", fmt.Errorf("decoding watch error: %w", err)
		}
		return 0, nil, "", &apierrors.StatusError{ErrStatus: st}
	default:
		return 0, nil, "", fmt.Errorf("unknown watch event type %q", typ)
	}
	o, err := decodeObject(obj, w.stripMF)
	if err != nil {
		return 0, nil, "", err
	}
	if len(o.JSON) > 0 && len(obj) > 0 && &o.JSON[0] == &obj[0] {
		o.JSON = bytes.Clone(obj) // the frame's bytes are reused
	}
	return t, o, o.ResourceVersion, nil
}

// withTypeMeta returns o with apiVersion and kind from typeMeta
// (`{"apiVersion":...,"kind":...,`) prepended to its JSON, unless it has a
// kind already. List items come without them.
func withTypeMeta(o *Object, apiVersion, kind string, typeMeta []byte) *Object {
	if o.Kind != "" {
		return o
	}
	raw := bytes.TrimLeft(o.JSON, " \t\r\n")[1:] // after '{': scanObject checked it
	out := make([]byte, 0, len(typeMeta)+len(raw))
	out = append(out, typeMeta...)
	if rest := bytes.TrimLeft(raw, " \t\r\n"); rest[0] == '}' { // an empty object
		out = append(out[:len(out)-1], rest...)
	} else {
		out = append(out, raw...)
	}
	o.JSON, o.APIVersion, o.Kind = out, apiVersion, kind
	return o
}

// watchTimeoutSeconds spreads watch lifetimes over 5-10 minutes, as the
// reflector does, so that many Sources do not re-watch in step.
func watchTimeoutSeconds() int { return 300 + rand.IntN(300) }

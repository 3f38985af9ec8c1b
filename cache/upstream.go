package cache

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/url"
	"slices"
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

// restUpstream talks to the API server in raw JSON or protobuf: objects are
// never decoded into Go types.
type restUpstream struct {
	client    rest.Interface
	path      string // collection path, e.g. /apis/apps/v1/namespaces/ns/deployments
	fieldSel  string
	pageSize  int64
	timeout   time.Duration // per LIST page; idle time of a WatchList
	stripMF   bool
	intern    *interner // may be nil
	watchList bool      // try WatchList (sendInitialEvents) before LIST
	protobuf  bool      // ask for protobuf (the server may still answer JSON)
}

// protobufAccept asks for protobuf, or JSON where a server has none.
const protobufAccept = "application/vnd.kubernetes.protobuf, application/json"

// get starts a GET of the collection with the Key's field selector.
func (u *restUpstream) get() *rest.Request {
	req := u.client.Get().AbsPath(u.path)
	if u.protobuf {
		req = req.SetHeader("Accept", protobufAccept)
	}
	if u.fieldSel != "" {
		req = req.Param("fieldSelector", u.fieldSel)
	}
	return req
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
		// A LIST that works proves WatchList unsupported; one that fails
		// alike says the request itself is wrong (a field selector).
		objs, rv, err = u.listPages(ctx)
		if err == nil {
			u.watchList = false
		}
		return objs, rv, err
	}
	return u.listPages(ctx)
}

// listPages lists with paged LIST requests.
func (u *restUpstream) listPages(ctx context.Context) ([]*Object, string, error) {
	var objs []*Object
	cont := ""
	for {
		req := u.get().Param("limit", strconv.FormatInt(u.pageSize, 10))
		if cont != "" {
			req = req.Param("continue", cont)
		}
		pageCtx, cancel := context.WithTimeout(ctx, u.timeout)
		body, err := req.DoRaw(pageCtx)
		cancel()
		if err != nil {
			return nil, "", withStatus(err, body)
		}
		if IsProtobuf(body) {
			items, rv, next, err := protoList(body, u.stripMF)
			if err != nil {
				return nil, "", fmt.Errorf("decoding list of %s: %w", u.path, err)
			}
			for _, o := range items {
				u.intern.object(o)
			}
			objs = append(objs, items...)
			if next == "" {
				return objs, rv, nil
			}
			cont = next
			continue
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
			o, h, err := decodeObject(raw, u.stripMF)
			if err != nil {
				return nil, "", fmt.Errorf("decoding list of %s: %w", u.path, err)
			}
			if h.kind == "" {
				o.Data = withTypeMeta(o.Data, itemType)
			}
			u.intern.object(o)
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
	req := u.get().
		Param("watch", "true").
		Param("sendInitialEvents", "true").
		Param("resourceVersionMatch", string(metav1.ResourceVersionMatchNotOlderThan)).
		Param("allowWatchBookmarks", "true")
	body, err := req.Stream(ctx)
	if err != nil {
		if apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) {
			return nil, "", fmt.Errorf("%w: %w", errWatchListUnsupported, err)
		}
		return nil, "", idleErr(err, idle)
	}
	ws := newRawWatchStream(body, u.stripMF, u.intern)
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
			if ws.endsInitialEvents() {
				return objs, rv, nil
			}
		default:
			return nil, "", fmt.Errorf("unexpected %s event during the initial events of %s", t, u.path)
		}
	}
}

func (u *restUpstream) watch(ctx context.Context, rv string) (watchStream, error) {
	req := u.get().
		Param("watch", "true").
		Param("resourceVersion", rv).
		Param("allowWatchBookmarks", "true").
		Param("timeoutSeconds", strconv.Itoa(watchTimeoutSeconds()))
	body, err := req.Stream(ctx)
	if err != nil {
		return nil, err
	}
	return newRawWatchStream(body, u.stripMF, u.intern), nil
}

// maxFrameBytes bounds one watch event: far above any object the API
// server stores (etcd refuses requests over 1.5 MiB by default).
const maxFrameBytes = 64 << 20

// rawWatchStream decodes a watch response body in the format the API
// server chose: JSON, a sequence of {"type":...,"object":...} values that
// it ends with newlines, or protobuf, frames of a 4-byte big-endian length
// and a metav1.WatchEvent. The first byte tells which: JSON starts with
// '{' (or space), a protobuf frame with its length's high byte.
type rawWatchStream struct {
	body    io.ReadCloser
	r       *bufio.Reader
	buf     []byte // JSON: read, not yet consumed: the start of the next frame
	stripMF bool
	intern  *interner // may be nil
	format  int       // 0 until the first byte is read
	// initialEventsEnd is set when the last Bookmark ended a WatchList's
	// initial events.
	initialEventsEnd bool
}

const (
	formatJSON = iota + 1
	formatProtobuf
)

// watchReadBuffer is the read buffer of a watch: what an HTTP/2 DATA frame
// holds (16 KiB by default), so that a read takes a whole one. Every open
// watch keeps one, busy or idle; a larger frame is read in pieces.
const watchReadBuffer = 16 << 10

func newRawWatchStream(body io.ReadCloser, stripMF bool, intern *interner) *rawWatchStream {
	return &rawWatchStream{body: body, r: bufio.NewReaderSize(body, watchReadBuffer), stripMF: stripMF, intern: intern}
}

func (w *rawWatchStream) close() { w.body.Close() }

// endsInitialEvents reports whether the last Bookmark ended a WatchList's
// initial events.
func (w *rawWatchStream) endsInitialEvents() bool { return w.initialEventsEnd }

// frameJSON returns the next top-level JSON value, valid until the next
// call.
func (w *rawWatchStream) frameJSON() ([]byte, error) {
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

// frameProtobuf returns the next length-delimited frame, valid until the
// next call.
func (w *rawWatchStream) frameProtobuf() ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(w.r, n[:]); err != nil {
		return nil, err // io.EOF between frames, else io.ErrUnexpectedEOF
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxFrameBytes {
		return nil, fmt.Errorf("watch event larger than %d bytes", maxFrameBytes)
	}
	w.buf = slices.Grow(w.buf[:0], int(size))[:size]
	if _, err := io.ReadFull(w.r, w.buf); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return w.buf, nil
}

func (w *rawWatchStream) next() (EventType, *Object, string, error) {
	if w.format == 0 {
		c, err := w.r.Peek(1)
		if err != nil {
			return 0, nil, "", err
		}
		w.format = formatProtobuf
		if bytes.IndexByte([]byte("{ \t\r\n"), c[0]) >= 0 {
			w.format = formatJSON
		}
	}
	var (
		typ string
		obj []byte
		err error
	)
	if w.format == formatJSON {
		typ, obj, err = w.nextJSON()
	} else {
		var b []byte
		if b, err = w.frameProtobuf(); err == nil {
			if typ, obj, err = protoWatchEvent(b); err != nil {
				err = fmt.Errorf("decoding watch event: %w", err)
			}
		}
	}
	if err != nil {
		return 0, nil, "", err
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
		rv, end, err := readBookmark(obj)
		if err != nil {
			return 0, nil, "", fmt.Errorf("decoding bookmark: %w", err)
		}
		w.initialEventsEnd = end
		return Bookmark, nil, rv, nil
	case "ERROR":
		st, err := readStatus(obj)
		if err != nil {
			return 0, nil, "", fmt.Errorf("decoding watch error: %w", err)
		}
		return 0, nil, "", &apierrors.StatusError{ErrStatus: *st}
	default:
		return 0, nil, "", fmt.Errorf("unknown watch event type %q", typ)
	}
	o, _, err := decodeAnyObject(obj, w.stripMF)
	if err != nil {
		return 0, nil, "", err
	}
	w.intern.share(o) // first: sharing managedFields copies the bytes
	if len(o.Data) > 0 && &o.Data[0] == &obj[0] {
		o.Data = bytes.Clone(obj) // the frame's bytes are reused
	}
	w.intern.object(o)
	return t, o, o.ResourceVersion, nil
}

// nextJSON reads the type and object of the next JSON frame.
func (w *rawWatchStream) nextJSON() (typ string, obj []byte, err error) {
	b, err := w.frameJSON()
	if err != nil {
		return "", nil, err
	}
	s := &scanner{b: b}
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
	if err == nil && len(obj) == 0 {
		err = errors.New("no object")
	}
	if err != nil {
		return "", nil, fmt.Errorf("decoding watch event: %w", err)
	}
	return typ, obj, nil
}

// header is what decoding reads of an object that its Object does not
// keep: the store reads it rarely, and pays for it per object otherwise.
type header struct{ apiVersion, kind, uid string }

// uidOf returns o's metadata.uid, read from its bytes, or "" if they have
// none (they were read once, so they can be).
func uidOf(o *Object) string {
	_, h, _ := decodeAnyObject(o.Data, false)
	return h.uid
}

// decodeAnyObject decodes an object in either format.
func decodeAnyObject(data []byte, strip bool) (*Object, header, error) {
	if IsProtobuf(data) {
		return decodeProtoObject(data, strip)
	}
	return decodeObject(data, strip)
}

// readBookmark reads a bookmark's resourceVersion and initial-events-end
// annotation, in either format.
func readBookmark(obj []byte) (rv string, initialEventsEnd bool, err error) {
	if IsProtobuf(obj) {
		return protoBookmark(obj)
	}
	var h struct {
		Metadata struct {
			ResourceVersion string            `json:"resourceVersion"`
			Annotations     map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(obj, &h); err != nil {
		return "", false, err
	}
	return h.Metadata.ResourceVersion, h.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true", nil
}

// withStatus returns the API server's Status in body as the error, when
// body is one: DoRaw reports a generic error for a status code and leaves
// the API server's reason and message in the body.
func withStatus(err error, body []byte) error {
	if len(body) == 0 {
		return err
	}
	st, serr := readStatus(body)
	if serr != nil || st.Kind != "Status" || st.Status != metav1.StatusFailure {
		return err
	}
	return &apierrors.StatusError{ErrStatus: *st}
}

// readStatus reads the Status of an ERROR event, in either format.
func readStatus(obj []byte) (*metav1.Status, error) {
	st := &metav1.Status{}
	if !IsProtobuf(obj) {
		return st, json.Unmarshal(obj, st)
	}
	_, _, raw, err := protoUnknown(obj)
	if err != nil {
		return nil, err
	}
	return st, st.Unmarshal(raw)
}

// withTypeMeta returns the JSON object data with typeMeta
// (`{"apiVersion":...,"kind":...,`) prepended to its members: list items
// come without them.
func withTypeMeta(data, typeMeta []byte) []byte {
	raw := bytes.TrimLeft(data, " \t\r\n")[1:] // after '{': scanObject checked it
	out := make([]byte, 0, len(typeMeta)+len(raw))
	out = append(out, typeMeta...)
	if rest := bytes.TrimLeft(raw, " \t\r\n"); rest[0] == '}' { // an empty object
		return append(out[:len(out)-1], rest...)
	}
	return append(out, raw...)
}

// watchTimeoutSeconds spreads watch lifetimes over 5-10 minutes, as the
// reflector does, so that many Sources do not re-watch in step.
func watchTimeoutSeconds() int { return 300 + rand.IntN(300) }

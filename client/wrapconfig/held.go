package wrapconfig

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/informerd/informerd/internal/snapdiff"
)

// A RESET answered with the changes. The daemon starts a stream over with
// a RESET and a snapshot when it no longer holds the stream's position:
// its informer relisted after the API server's 410, or a restarted daemon
// never had it (client.Stream.Reset says so before the first event). The
// API server would have answered the caller's watch from its own cache,
// so a 410 there makes every wrapped reflector relist for nothing. The
// client-go adapters answer such a RESET with the difference between what
// their receiver holds and the snapshot; WrapConfig does the same where it
// knows what its caller holds:
//
//   - A list the wrapper served leaves its objects, for resumeTTL, to the
//     watch that resumes from its resourceVersion (a reflector watches
//     right after it lists); a watch with initial events starts from them.
//   - A watch holds every object it sent since (held), and when it ends
//     leaves what it holds to the watch that resumes from the last
//     position it told its caller, which a reflector starts at once, at
//     each timeoutSeconds or after the daemon went away.
//   - On a RESET such a watch reads the snapshot to its end and sends
//     DELETED, ADDED and MODIFIED events from what its caller holds to it
//     (internal/snapdiff: deletions first, stamped with the last position
//     the caller was told, so that a caller resuming from any event of the
//     difference is sent the rest of it), then a bookmark at the
//     snapshot, if the caller takes them. No 410, no relist.
//
// What the wrappers of one config hold is bounded (maxHeldBytes, and as
// much again for what they left); a watch that would go over drops what
// it holds and answers a RESET with 410, as before. A watch that holds
// nothing and whose resume point the daemon lost passes through to the
// API server, which may still serve it.

const (
	// resumeTTL is how long what a list or a watch left waits for the
	// watch resuming from it.
	resumeTTL = 10 * time.Second
	// maxHeldBytes bounds, per wrapped config, the objects its watches
	// hold, and separately what they and its lists left.
	maxHeldBytes = 64 << 20
)

// objectMeta is what the wrapper reads of an object's metadata.
type objectMeta struct {
	namespace, name, resourceVersion, uid string
}

// readMeta reads the metadata of an object as the daemon sent it: JSON
// (the decoder stops after metadata, which the API server writes before
// spec and status), or protobuf in the API server's envelope, whose
// message has its ObjectMeta as field 1 (protobufLayout).
func readMeta(b []byte) (objectMeta, error) {
	if isProtobuf(b) {
		return readProtoMeta(b)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return objectMeta{}, errors.New("an object that is not a JSON object")
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return objectMeta{}, err
		}
		if t != "metadata" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return objectMeta{}, err
			}
			continue
		}
		var m struct {
			Name            string `json:"name"`
			Namespace       string `json:"namespace"`
			ResourceVersion string `json:"resourceVersion"`
			UID             string `json:"uid"`
		}
		if err := dec.Decode(&m); err != nil {
			return objectMeta{}, err
		}
		return objectMeta{m.Namespace, m.Name, m.ResourceVersion, m.UID}, nil
	}
	return objectMeta{}, errors.New("an object without metadata")
}

// Field numbers of the protobuf messages readProtoMeta and stampProto
// walk (k8s.io/apimachinery's generated.proto).
const (
	unknownRaw          = 2 // runtime.Unknown.raw
	objectMetaField     = 1 // every built-in kind's metadata
	metaName            = 1
	metaNamespace       = 3
	metaUID             = 5
	metaResourceVersion = 6
)

// readProtoMeta reads the metadata of a protobuf object without decoding
// the rest of it.
func readProtoMeta(b []byte) (objectMeta, error) {
	raw, err := protoField(b[len(protobufMagic):], unknownRaw)
	if err != nil {
		return objectMeta{}, err
	}
	om, err := protoField(raw, objectMetaField)
	if err != nil {
		return objectMeta{}, err
	}
	var m objectMeta
	for len(om) > 0 {
		n, typ, l := protowire.ConsumeTag(om)
		if l < 0 {
			return objectMeta{}, protowire.ParseError(l)
		}
		om = om[l:]
		if typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(om)
			if l < 0 {
				return objectMeta{}, protowire.ParseError(l)
			}
			switch n {
			case metaName:
				m.name = string(v)
			case metaNamespace:
				m.namespace = string(v)
			case metaUID:
				m.uid = string(v)
			case metaResourceVersion:
				m.resourceVersion = string(v)
			}
			om = om[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, om)
		if l < 0 {
			return objectMeta{}, protowire.ParseError(l)
		}
		om = om[l:]
	}
	return m, nil
}

// protoField returns the bytes of field n of message b (its last, as
// protobuf merges).
func protoField(b []byte, n protowire.Number) ([]byte, error) {
	var out []byte
	found := false
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		b = b[l:]
		if num == n && typ == protowire.BytesType {
			v, l := protowire.ConsumeBytes(b)
			if l < 0 {
				return nil, protowire.ParseError(l)
			}
			out, found = v, true
			b = b[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(num, typ, b)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		b = b[l:]
	}
	if !found {
		return nil, fmt.Errorf("a protobuf message without field %d", n)
	}
	return out, nil
}

// withProtoField returns message b with field n (of bytes) set to v.
func withProtoField(b []byte, n protowire.Number, v []byte) ([]byte, error) {
	out := make([]byte, 0, len(b)+len(v)+8)
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return nil, protowire.ParseError(l)
		}
		vl := protowire.ConsumeFieldValue(num, typ, b[l:])
		if vl < 0 {
			return nil, protowire.ParseError(vl)
		}
		if num != n {
			out = append(out, b[:l+vl]...)
		}
		b = b[l+vl:]
	}
	out = protowire.AppendTag(out, n, protowire.BytesType)
	return protowire.AppendBytes(out, v), nil
}

// withResourceVersion returns the object b (as the daemon sent it) with
// its metadata.resourceVersion set to rv: a deletion's object carries
// the position of the deletion, as the API server's.
func withResourceVersion(b []byte, rv string) ([]byte, error) {
	if isProtobuf(b) {
		u := b[len(protobufMagic):]
		raw, err := protoField(u, unknownRaw)
		if err != nil {
			return nil, err
		}
		om, err := protoField(raw, objectMetaField)
		if err != nil {
			return nil, err
		}
		if om, err = withProtoField(om, metaResourceVersion, []byte(rv)); err != nil {
			return nil, err
		}
		if raw, err = withProtoField(raw, objectMetaField, om); err != nil {
			return nil, err
		}
		if u, err = withProtoField(u, unknownRaw, raw); err != nil {
			return nil, err
		}
		return append(slices.Clip(protobufMagic), u...), nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // numbers as they were
	var obj map[string]any
	if err := dec.Decode(&obj); err != nil {
		return nil, err
	}
	m, ok := obj["metadata"].(map[string]any)
	if !ok {
		return nil, errors.New("an object without metadata")
	}
	m["resourceVersion"] = rv
	return json.Marshal(obj)
}

// heldKey is an object's key: its namespace and name.
type heldKey struct{ namespace, name string }

// heldObject is an object a watch's caller holds, as the daemon sent it.
type heldObject struct {
	raw     []byte
	rv, uid string
}

// held is what a watch's caller holds, by key, and its bytes.
type held struct {
	objs  map[heldKey]heldObject
	bytes int64
}

// heldFrom reads the objects of a list the wrapper served.
func heldFrom(objs [][]byte) (*held, error) {
	h := &held{objs: make(map[heldKey]heldObject, len(objs))}
	for _, b := range objs {
		if err := h.put(b); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// put notes that the caller holds object b (added or modified).
func (h *held) put(b []byte) error {
	m, err := readMeta(b)
	if err != nil {
		return err
	}
	k := heldKey{m.namespace, m.name}
	h.bytes += int64(len(b)) - int64(len(h.objs[k].raw))
	h.objs[k] = heldObject{raw: b, rv: m.resourceVersion, uid: m.uid}
	return nil
}

// remove notes that the caller no longer holds object b (deleted).
func (h *held) remove(b []byte) error {
	m, err := readMeta(b)
	if err != nil {
		return err
	}
	k := heldKey{m.namespace, m.name}
	h.bytes -= int64(len(h.objs[k].raw))
	delete(h.objs, k)
	return nil
}

// heldEntry is one object of a sorted held.
type heldEntry struct {
	k heldKey
	o heldObject
}

func (h *held) sorted() []heldEntry {
	out := make([]heldEntry, 0, len(h.objs))
	for k, o := range h.objs {
		out = append(out, heldEntry{k, o})
	}
	slices.SortFunc(out, heldAccessors.Compare)
	return out
}

var heldAccessors = snapdiff.Accessors[heldEntry]{
	Compare: func(a, b heldEntry) int {
		if c := strings.Compare(a.k.namespace, b.k.namespace); c != 0 {
			return c
		}
		return strings.Compare(a.k.name, b.k.name)
	},
	ResourceVersion: func(e heldEntry) string { return e.o.rv },
	UID:             func(e heldEntry) string { return e.o.uid },
}

// heldChange is one event of changesTo: its type, object and position.
type heldChange struct {
	typ, rv string
	raw     []byte
}

// changesTo returns the events that take a caller holding h to fresh, in
// snapdiff's order; deletions carry resourceVersion deletedAt.
func (h *held) changesTo(fresh *held, deletedAt string) ([]heldChange, error) {
	changes := snapdiff.Diff(slices.Values(h.sorted()), fresh.sorted(), heldAccessors)
	out := make([]heldChange, 0, len(changes))
	for _, c := range changes {
		raw, rv := c.Object.o.raw, c.Object.o.rv
		if c.Type == snapdiff.Deleted {
			var err error
			if raw, err = withResourceVersion(raw, deletedAt); err != nil {
				return nil, err
			}
			rv = deletedAt
		}
		out = append(out, heldChange{typ: c.Type.String(), rv: rv, raw: raw})
	}
	return out, nil
}

// leftover is what a list or a watch left for the watch resuming from
// its position: a list's objects, read only if a watch takes them, or
// what a watch held.
type leftover struct {
	objs [][]byte
	h    *held
}

// leftovers keeps leftovers by the request's shape and position.
type leftovers = ttlCache[pageKey, *leftover]

func newLeftovers() *leftovers { return newTTLCache[pageKey, *leftover](resumeTTL, maxHeldBytes) }

// heldBudget counts the bytes the watches of one wrapped config hold.
type heldBudget struct{ n atomic.Int64 }

// take reserves n bytes, if they fit.
func (b *heldBudget) take(n int64) bool {
	if b.n.Add(n) > maxHeldBytes {
		b.n.Add(-n)
		return false
	}
	return true
}

func (b *heldBudget) give(n int64) { b.n.Add(-n) }

// heldFor returns what the caller of watch r holds, if a list or watch
// left it for r's resume point (nil if not, or if it does not fit in the
// budget; the caller gives its bytes back).
func (t *wrapTransport) heldFor(r *readRequest) *held {
	if !r.watch || r.resourceVersion == "" || r.resourceVersion == "0" || (r.sendInitialEvents != nil && *r.sendInitialEvents) {
		return nil
	}
	l, ok := t.left.take(t.pageKey(r, r.resourceVersion), time.Now())
	if !ok {
		return nil
	}
	h := l.h
	if h == nil {
		var err error
		if h, err = heldFrom(l.objs); err != nil {
			return nil
		}
	}
	if !t.held.take(h.bytes) {
		return nil
	}
	return h
}

// maxFrameBytes bounds a frame of a passed-through watch that an
// observedBody reads; past it, it stops reading frames.
const maxFrameBytes = 64 << 20

// observe hands h, what the caller of the watch r holds, to the watch the
// API server answers instead of the daemon (resp): its body notes the
// events the caller receives, and leaves what the caller holds when it
// ends, for the watch resuming from there, which may be the daemon's
// again. The daemon going away and coming back then costs the caller no
// relist. Without h, or for another answer, resp is returned as it is.
func (t *wrapTransport) observe(r *readRequest, h *held, resp *http.Response, err error) (*http.Response, error) {
	if h == nil {
		return resp, err
	}
	if err != nil || resp.StatusCode != http.StatusOK {
		t.held.give(h.bytes)
		return resp, err
	}
	ct := resp.Header.Get("Content-Type")
	resp.Body = &observedBody{ReadCloser: resp.Body, t: t, h: h, key: t.pageKey(r, ""), told: r.resourceVersion,
		protobuf: strings.HasPrefix(ct, mediaProtobuf)}
	return resp, nil
}

// observedBody is the body of a watch the API server answers for the
// daemon: as the caller reads it, it reads its frames (a JSON event per
// line, or a protobuf one after its 4-byte length) into what the caller
// holds. A caller may close it while another goroutine reads.
type observedBody struct {
	io.ReadCloser
	t        *wrapTransport
	key      pageKey
	protobuf bool

	mu   sync.Mutex // guards the fields below
	h    *held      // nil once it stopped (an error, a frame it cannot read) or left
	told string     // the last position the caller received
	buf  []byte     // the start of a frame not yet complete
}

func (b *observedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.h != nil && n > 0 {
		b.buf = append(b.buf, p[:n]...)
		b.frames()
	}
	if err != nil {
		b.leave()
	}
	return n, err
}

func (b *observedBody) Close() error {
	b.mu.Lock()
	b.leave()
	b.mu.Unlock()
	return b.ReadCloser.Close()
}

// frames reads the complete frames in b.buf; b.mu held.
func (b *observedBody) frames() {
	for b.h != nil {
		var frame []byte
		if b.protobuf {
			if len(b.buf) < 4 {
				return
			}
			size := int(binary.BigEndian.Uint32(b.buf))
			if size > maxFrameBytes {
				b.stop()
				return
			}
			if len(b.buf) < 4+size {
				return
			}
			frame, b.buf = b.buf[4:4+size], b.buf[4+size:]
		} else {
			i := bytes.IndexByte(b.buf, '\n')
			if i < 0 {
				if len(b.buf) > maxFrameBytes {
					b.stop()
				}
				return
			}
			frame, b.buf = b.buf[:i], b.buf[i+1:]
		}
		b.event(frame)
	}
	if len(b.buf) == 0 {
		b.buf = nil // not keep a large array for nothing
	}
}

// event notes one frame's event; b.mu held.
func (b *observedBody) event(frame []byte) {
	var typ string
	var obj []byte
	if b.protobuf {
		var ev metav1.WatchEvent
		if err := ev.Unmarshal(frame); err != nil {
			b.stop()
			return
		}
		typ, obj = ev.Type, ev.Object.Raw
	} else {
		var ev struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := json.Unmarshal(frame, &ev); err != nil {
			b.stop()
			return
		}
		typ, obj = ev.Type, slices.Clone([]byte(ev.Object)) // held past the frame's buffer
	}
	if b.protobuf {
		obj = slices.Clone(obj)
	}
	before := b.h.bytes
	var err error
	switch typ {
	case "ADDED", "MODIFIED":
		err = b.h.put(obj)
	case "DELETED":
		err = b.h.remove(obj)
	case "BOOKMARK":
		var m objectMeta
		if m, err = readMeta(obj); err == nil {
			b.told = m.resourceVersion
		}
		return
	default: // ERROR: the caller lists again
		b.stop()
		return
	}
	if err != nil || !b.t.held.take(b.h.bytes-before) {
		b.h.bytes = before
		b.stop()
		return
	}
	if m, err := readMeta(obj); err == nil {
		b.told = m.resourceVersion
	}
}

// stop stops noting events: what the caller holds is no longer known;
// b.mu held.
func (b *observedBody) stop() {
	if b.h != nil {
		b.t.held.give(b.h.bytes)
		b.h, b.buf = nil, nil
	}
}

// leave keeps what the caller holds for the watch resuming from its last
// position (once: then it holds nothing); b.mu held.
func (b *observedBody) leave() {
	h := b.h
	b.stop()
	if h == nil || b.told == "" || b.told == "0" {
		return
	}
	k := b.key
	k.rv = b.told
	b.t.left.add(k, &leftover{h: h}, h.bytes, time.Now())
}

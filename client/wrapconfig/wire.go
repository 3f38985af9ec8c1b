package wrapconfig

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
)

// The Kubernetes wire formats that WrapConfig answers in, as the API
// server writes them (k8s.io/apiserver's handlers and apimachinery's
// serializers): a List in JSON or protobuf, a watch as a stream of
// WatchEvents (JSON objects one per line, or protobuf frames each prefixed
// by its length in 4 bytes, big-endian), and PartialObjectMetadata in
// either. Objects are written as the daemon sent them (the API server's
// own bytes); only the envelopes are built here.

const (
	mediaJSON     = "application/json"
	mediaProtobuf = "application/vnd.kubernetes.protobuf"
)

// wireFormat is how one response is encoded.
type wireFormat struct {
	// protobuf: application/vnd.kubernetes.protobuf, else application/json.
	protobuf bool
	// metadata: PartialObjectMetadata(List) of meta.k8s.io/v1.
	metadata bool
	// jsonFallback: the client also accepts plain JSON, which the API
	// server answers for a resource without a protobuf encoding.
	jsonFallback bool
}

// contentType is the response's Content-Type.
func (f wireFormat) contentType(watch bool) string {
	switch {
	case f.protobuf && watch:
		return mediaProtobuf + ";stream=watch"
	case f.protobuf:
		return mediaProtobuf
	}
	return mediaJSON
}

// kindInfo is what the envelopes of one resource need.
type kindInfo struct {
	gvk schema.GroupVersionKind
	// builtin: client-go's scheme knows the kind, so the daemon can send
	// it in protobuf, and JSON list items carry no apiVersion and kind (the
	// API server encodes typed lists with empty TypeMeta in items).
	builtin bool
}

// protobufLayouts caches, per kind, whether its Go type and its list's
// have the layout the protobuf envelopes assume.
var protobufLayouts sync.Map // schema.GroupVersionKind -> bool

// protobufLayout reports whether gvk's protobuf message has its ObjectMeta
// as field 1 and its list's has ListMeta as field 1 and the items as field
// 2, as every built-in type's has: the envelopes are built on that, so a
// kind without it is not served in protobuf. It reads the struct tags of
// client-go's Go types.
func protobufLayout(gvk schema.GroupVersionKind) bool {
	if v, ok := protobufLayouts.Load(gvk); ok {
		return v.(bool)
	}
	ok := fieldTag(gvk, "ObjectMeta", "bytes,1,") &&
		fieldTag(gvk.GroupVersion().WithKind(gvk.Kind+"List"), "ListMeta", "bytes,1,") &&
		fieldTag(gvk.GroupVersion().WithKind(gvk.Kind+"List"), "Items", "bytes,2,rep,")
	protobufLayouts.Store(gvk, ok)
	return ok
}

func fieldTag(gvk schema.GroupVersionKind, field, prefix string) bool {
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return false
	}
	t := reflect.TypeOf(obj)
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return false
	}
	f, ok := t.Elem().FieldByName(field)
	return ok && strings.HasPrefix(f.Tag.Get("protobuf"), prefix)
}

// protoEnvelope returns raw as the API server's protobuf encoding of an
// object of apiVersion and kind: "k8s\x00" and a runtime.Unknown.
func protoEnvelope(apiVersion, kind string, raw []byte) []byte {
	u := runtime.Unknown{TypeMeta: runtime.TypeMeta{APIVersion: apiVersion, Kind: kind}, Raw: raw}
	b := make([]byte, len(protobufMagic), len(protobufMagic)+u.Size())
	copy(b, protobufMagic)
	n, _ := u.MarshalToSizedBuffer(b[len(protobufMagic):cap(b)]) // sized: cannot fail
	return b[:len(protobufMagic)+n]
}

// protoRaw returns the message inside an object in the API server's
// protobuf encoding.
func protoRaw(b []byte) ([]byte, error) {
	if !isProtobuf(b) {
		return nil, errors.New("the daemon sent an object that is not protobuf")
	}
	var u runtime.Unknown
	if err := u.Unmarshal(b[len(protobufMagic):]); err != nil {
		return nil, fmt.Errorf("reading the daemon's protobuf object: %w", err)
	}
	return u.Raw, nil
}

// partialMetadata decodes an object of the daemon's metadata view (JSON)
// into the PartialObjectMetadata the API server would send for it.
func partialMetadata(b []byte) (*metav1.PartialObjectMetadata, error) {
	var pom metav1.PartialObjectMetadata
	if err := json.Unmarshal(b, &pom); err != nil {
		return nil, fmt.Errorf("reading the daemon's metadata object: %w", err)
	}
	pom.TypeMeta = metav1.TypeMeta{APIVersion: metav1.SchemeGroupVersion.String(), Kind: "PartialObjectMetadata"}
	return &pom, nil
}

// encodeList returns the body of a List response holding p's objects (as
// the daemon sent them) at resourceVersion rv, byte for byte as the API
// server encodes it (k8s.io/apimachinery's JSON serializer and its
// streaming collection encoder): a built-in kind's list with kind,
// apiVersion, metadata, items in that order and items without their
// kind and apiVersion; a custom resource's list with its keys sorted and
// "continue" always in its metadata; a newline after JSON.
func encodeList(f wireFormat, k kindInfo, p listPage, rv string) ([]byte, error) {
	lm := metav1.ListMeta{ResourceVersion: rv, Continue: p.cont, RemainingItemCount: p.remaining}
	if f.metadata {
		l := metav1.PartialObjectMetadataList{
			TypeMeta: metav1.TypeMeta{APIVersion: metav1.SchemeGroupVersion.String(), Kind: "PartialObjectMetadataList"},
			ListMeta: lm,
			Items:    make([]metav1.PartialObjectMetadata, 0, len(p.objs)),
		}
		for _, b := range p.objs {
			pom, err := partialMetadata(b)
			if err != nil {
				return nil, err
			}
			l.Items = append(l.Items, *pom)
		}
		if f.protobuf {
			raw, err := l.Marshal()
			if err != nil {
				return nil, err
			}
			return protoEnvelope(l.APIVersion, l.Kind, raw), nil
		}
		b, err := json.Marshal(&l)
		return append(b, '\n'), err
	}
	apiVersion, kind := k.gvk.GroupVersion().String(), k.gvk.Kind+"List"
	if f.protobuf {
		meta, err := lm.Marshal()
		if err != nil {
			return nil, err
		}
		raw := protowire.AppendTag(nil, 1, protowire.BytesType)
		raw = protowire.AppendBytes(raw, meta)
		for _, b := range p.objs {
			item, err := protoRaw(b)
			if err != nil {
				return nil, err
			}
			raw = protowire.AppendTag(raw, 2, protowire.BytesType)
			raw = protowire.AppendBytes(raw, item)
		}
		return protoEnvelope(apiVersion, kind, raw), nil
	}
	var buf bytes.Buffer
	str := func(s string) { b, _ := json.Marshal(s); buf.Write(b) } // a string: cannot fail
	items := func() error {
		buf.WriteString(`"items":[`)
		for i, b := range p.objs {
			if i > 0 {
				buf.WriteByte(',')
			}
			if k.builtin {
				var err error
				if b, err = withoutTypeMeta(b); err != nil {
					return err
				}
			}
			buf.Write(b)
		}
		buf.WriteByte(']')
		return nil
	}
	if k.builtin {
		buf.WriteString(`{"kind":`)
		str(kind)
		buf.WriteString(`,"apiVersion":`)
		str(apiVersion)
		meta, _ := json.Marshal(lm) // cannot fail
		buf.WriteString(`,"metadata":`)
		buf.Write(meta)
		buf.WriteByte(',')
		if err := items(); err != nil {
			return nil, err
		}
		buf.WriteString("}\n")
		return buf.Bytes(), nil
	}
	// An UnstructuredList: its keys sorted, as those of its metadata.
	buf.WriteString(`{"apiVersion":`)
	str(apiVersion)
	buf.WriteByte(',')
	if err := items(); err != nil {
		return nil, err
	}
	buf.WriteString(`,"kind":`)
	str(kind)
	buf.WriteString(`,"metadata":{"continue":`)
	str(p.cont)
	if p.remaining != nil {
		buf.WriteString(`,"remainingItemCount":`)
		buf.WriteString(strconv.FormatInt(*p.remaining, 10))
	}
	buf.WriteString(`,"resourceVersion":`)
	str(rv)
	buf.WriteString("}}\n")
	return buf.Bytes(), nil
}

// withoutTypeMeta returns a JSON object without its apiVersion and kind,
// as items of a built-in type's list are encoded, its other fields in
// their order. The API server writes kind and apiVersion first.
func withoutTypeMeta(b []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil, errors.New("reading the daemon's object: not a JSON object")
	}
	end, dropped := int64(1), 0 // the bytes before the first field kept
	for dropped < 2 && d.More() {
		t, err := d.Token()
		if err != nil {
			return nil, fmt.Errorf("reading the daemon's object: %w", err)
		}
		if t != "kind" && t != "apiVersion" {
			break
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("reading the daemon's object: %w", err)
		}
		end, dropped = d.InputOffset(), dropped+1
	}
	if dropped == 2 {
		rest := bytes.TrimPrefix(bytes.TrimLeft(b[end:], " \t\r\n"), []byte(","))
		return append([]byte{'{'}, rest...), nil
	}
	// Elsewhere in the object: drop them wherever they are.
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("reading the daemon's object: %w", err)
	}
	delete(m, "apiVersion")
	delete(m, "kind")
	return json.Marshal(m)
}

// watchEncoder writes the frames of one watch response.
type watchEncoder struct {
	f wireFormat
	k kindInfo
}

// event returns the frame of an event of type t carrying obj as the daemon
// sent it.
func (e watchEncoder) event(t string, obj []byte) ([]byte, error) {
	if e.f.metadata {
		pom, err := partialMetadata(obj)
		if err != nil {
			return nil, err
		}
		if obj, err = e.encodeMeta(pom); err != nil {
			return nil, err
		}
	} else if e.f.protobuf && !isProtobuf(obj) {
		return nil, errors.New("the daemon sent an object that is not protobuf")
	}
	return e.frame(t, obj)
}

// encodeMeta encodes a PartialObjectMetadata in e's format.
func (e watchEncoder) encodeMeta(pom *metav1.PartialObjectMetadata) ([]byte, error) {
	if !e.f.protobuf {
		return json.Marshal(pom)
	}
	raw, err := pom.Marshal()
	if err != nil {
		return nil, err
	}
	return protoEnvelope(pom.APIVersion, pom.Kind, raw), nil
}

// bookmark returns the frame of a BOOKMARK at rv: an object of the
// resource's kind (PartialObjectMetadata for metadata) with only its
// resourceVersion, and, to end a WatchList's initial events, the
// k8s.io/initial-events-end annotation.
func (e watchEncoder) bookmark(rv string, initialEventsEnd bool) ([]byte, error) {
	om := metav1.ObjectMeta{ResourceVersion: rv}
	if initialEventsEnd {
		om.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	var obj []byte
	var err error
	switch {
	case e.f.metadata:
		obj, err = e.encodeMeta(&metav1.PartialObjectMetadata{
			TypeMeta:   metav1.TypeMeta{APIVersion: metav1.SchemeGroupVersion.String(), Kind: "PartialObjectMetadata"},
			ObjectMeta: om,
		})
	case e.f.protobuf:
		var meta []byte
		if meta, err = om.Marshal(); err == nil {
			raw := protowire.AppendTag(nil, 1, protowire.BytesType) // ObjectMeta, field 1 (protobufLayout)
			raw = protowire.AppendBytes(raw, meta)
			obj = protoEnvelope(e.k.gvk.GroupVersion().String(), e.k.gvk.Kind, raw)
		}
	default:
		obj, err = json.Marshal(struct {
			Kind       string            `json:"kind"`
			APIVersion string            `json:"apiVersion"`
			Metadata   metav1.ObjectMeta `json:"metadata"`
		}{e.k.gvk.Kind, e.k.gvk.GroupVersion().String(), om})
	}
	if err != nil {
		return nil, err
	}
	return e.frame(string(watchBookmark), obj)
}

// errorEvent returns the frame of an ERROR event carrying st.
func (e watchEncoder) errorEvent(st *metav1.Status) ([]byte, error) {
	obj, err := encodeStatus(e.f, st)
	if err != nil {
		return nil, err
	}
	return e.frame(string(watchError), obj)
}

type watchEventType string

const (
	watchBookmark watchEventType = "BOOKMARK"
	watchError    watchEventType = "ERROR"
)

// frame returns one WatchEvent of type t around the encoded obj: a JSON
// line, or a protobuf message after its 4-byte length.
func (e watchEncoder) frame(t string, obj []byte) ([]byte, error) {
	if !e.f.protobuf {
		var buf bytes.Buffer
		buf.Grow(len(obj) + 32)
		tb, _ := json.Marshal(t) // a string: cannot fail
		buf.WriteString(`{"type":`)
		buf.Write(tb)
		buf.WriteString(`,"object":`)
		buf.Write(obj)
		buf.WriteString("}\n")
		return buf.Bytes(), nil
	}
	ev := metav1.WatchEvent{Type: t, Object: runtime.RawExtension{Raw: obj}}
	b := make([]byte, 4+ev.Size())
	n, err := ev.MarshalToSizedBuffer(b[4:])
	if err != nil {
		return nil, err
	}
	binary.BigEndian.PutUint32(b, uint32(n))
	return b[:4+n], nil
}

// encodeStatus encodes st as the API server encodes a Status in f
// (metadata or not: a Status is a Status).
func encodeStatus(f wireFormat, st *metav1.Status) ([]byte, error) {
	st.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
	if !f.protobuf {
		return json.Marshal(st)
	}
	raw, err := st.Marshal()
	if err != nil {
		return nil, err
	}
	return protoEnvelope("v1", "Status", raw), nil
}

// protobufMagic starts every object in the API server's protobuf encoding.
var protobufMagic = []byte("k8s\x00")

func isProtobuf(b []byte) bool { return bytes.HasPrefix(b, protobufMagic) }

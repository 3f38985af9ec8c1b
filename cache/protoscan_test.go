package cache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

// serializer is client-go's serializer for a media type: the encodings the
// API server uses for built-in types.
func serializer(t testing.TB, mediaType string) runtime.Serializer {
	for _, i := range scheme.Codecs.SupportedMediaTypes() {
		if i.MediaType == mediaType {
			return i.Serializer
		}
	}
	t.Fatalf("no serializer for %s", mediaType)
	return nil
}

func protoSerializer(t testing.TB) runtime.Serializer {
	return serializer(t, runtime.ContentTypeProtobuf)
}

// encode encodes obj with s.
func encode(t testing.TB, s runtime.Serializer, obj runtime.Object) []byte {
	var b bytes.Buffer
	if err := s.Encode(obj, &b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeProto(t testing.TB, obj runtime.Object) []byte { return encode(t, protoSerializer(t), obj) }

func TestDecodeProtoObject(t *testing.T) {
	pod := formatPod()
	pod.Labels = map[string]string{"app": "web", "tier": "front"}
	pod.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}
	data := encodeProto(t, pod)

	o, h, err := decodeProtoObject(data, true)
	if err != nil {
		t.Fatal(err)
	}
	if h != (header{apiVersion: "v1", kind: "Pod", uid: string(pod.UID)}) || o.Name != pod.Name || o.Namespace != pod.Namespace ||
		o.ResourceVersion != pod.ResourceVersion || !maps.Equal(o.Labels, pod.Labels) {
		t.Fatalf("decodeProtoObject read %+v %+v from %s/%s", *o, h, pod.Namespace, pod.Name)
	}
	got, _, err := protoSerializer(t).Decode(o.Data, nil, nil)
	if err != nil {
		t.Fatalf("the stripped object does not decode: %v", err)
	}
	want := pod.DeepCopy()
	want.ManagedFields = nil
	if gotPod := got.(*corev1.Pod); !bytes.Equal(encodeProto(t, gotPod), encodeProto(t, want)) {
		t.Fatalf("stripped object differs beyond managedFields:\n got %+v\nwant %+v", gotPod, want)
	}

	kept, _, err := decodeProtoObject(data, false)
	if err != nil || !bytes.Equal(kept.Data, data) {
		t.Fatalf("without strip the bytes changed (%v)", err)
	}

	meta, err := ViewMetadata.Project(o)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := protoSerializer(t).Decode(meta, nil, nil)
	if err != nil {
		t.Fatalf("the metadata view does not decode: %v", err)
	}
	if mp := m.(*corev1.Pod); mp.Name != pod.Name || len(mp.Spec.Containers) != 0 || mp.Status.Phase != "" {
		t.Fatalf("metadata view of a Pod kept more than metadata: %+v", mp)
	}
}

// watchFrame returns a protobuf watch frame: a length and a WatchEvent.
func watchFrame(t testing.TB, typ string, obj runtime.Object) []byte {
	ev := metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: encodeProto(t, obj)}}
	b, err := ev.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...)
}

func TestProtobufWatchStream(t *testing.T) {
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "n", ResourceVersion: "7",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}, Data: map[string]string{"k": "v"}}
	bm := &corev1.ConfigMap{TypeMeta: cm.TypeMeta, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "9",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	gone := apierrors.NewResourceExpired("too old").ErrStatus
	gone.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}
	var body []byte
	body = append(body, watchFrame(t, "ADDED", cm)...)
	body = append(body, watchFrame(t, "BOOKMARK", bm)...)
	body = append(body, watchFrame(t, "ERROR", &gone)...)
	ws := newRawWatchStream(io.NopCloser(bytes.NewReader(body)), true, nil)
	defer ws.close()

	typ, o, rv, err := ws.next()
	if err != nil || typ != Added || o.Name != "a" || rv != "7" || !IsProtobuf(o.Data) {
		t.Fatalf("first event: %v %+v %q %v", typ, o, rv, err)
	}
	if bytes.Contains(o.Data, []byte("\"m\"")) || bytes.Contains(o.Data, []byte{0x0a, 0x01, 'm'}) {
		t.Fatalf("managedFields kept: %q", o.Data)
	}
	typ, _, rv, err = ws.next()
	if err != nil || typ != Bookmark || rv != "9" || !ws.endsInitialEvents() {
		t.Fatalf("bookmark: %v %q %v end=%v", typ, rv, err, ws.endsInitialEvents())
	}
	_, _, _, err = ws.next()
	if !apierrors.IsResourceExpired(err) {
		t.Fatalf("ERROR frame gave %v, want 410 Expired", err)
	}
	if _, _, _, err = ws.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}

	// A frame cut short is an error, not a clean end.
	cut := watchFrame(t, "ADDED", cm)
	ws = newRawWatchStream(io.NopCloser(bytes.NewReader(cut[:len(cut)-3])), true, nil)
	if _, _, _, err := ws.next(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated frame: %v, want ErrUnexpectedEOF", err)
	}
}

func TestProtoList(t *testing.T) {
	list := &corev1.ConfigMapList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMapList"},
		ListMeta: metav1.ListMeta{ResourceVersion: "42", Continue: "next"}}
	for _, n := range []string{"a", "b"} {
		list.Items = append(list.Items, corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: "ns",
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}})
	}
	objs, rv, cont, err := protoList(encodeProto(t, list), true)
	if err != nil || rv != "42" || cont != "next" || len(objs) != 2 {
		t.Fatalf("protoList: %d objects, rv %q, continue %q, %v", len(objs), rv, cont, err)
	}
	for i, o := range objs {
		got, _, err := protoSerializer(t).Decode(o.Data, nil, nil)
		if err != nil {
			t.Fatalf("item %d does not decode: %v", i, err)
		}
		cm := got.(*corev1.ConfigMap)
		_, h, err := decodeProtoObject(o.Data, false)
		if err != nil || h.kind != "ConfigMap" || h.apiVersion != "v1" || cm.Name != list.Items[i].Name || o.Name != cm.Name || len(cm.ManagedFields) != 0 {
			t.Fatalf("item %d: %+v (%+v, %v) decodes as %+v", i, o, h, err, cm)
		}
	}
}

// FuzzDecodeProtoObject: whatever bytes come as protobuf, decoding returns
// an error or an object whose bytes decode again to the same metadata.
func FuzzDecodeProtoObject(f *testing.F) {
	pod := formatPod()
	pod.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "m"}}
	f.Add(encodeProto(f, pod))
	f.Add(encodeProto(f, formatConfigMap()))
	f.Add([]byte("k8s\x00"))
	f.Add([]byte("k8s\x00\x12\x02\x0a\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		o, h, err := decodeProtoObject(data, true)
		if err != nil {
			return
		}
		again, againH, err := decodeProtoObject(o.Data, true)
		if err != nil {
			t.Fatalf("stripped bytes %q do not decode: %v", o.Data, err)
		}
		if again.Name != o.Name || again.Namespace != o.Namespace || again.ResourceVersion != o.ResourceVersion ||
			againH != h || !maps.Equal(again.Labels, o.Labels) || !bytes.Equal(again.Data, o.Data) {
			t.Fatalf("decoding is not stable: %+v then %+v", *o, *again)
		}
		if _, err := ViewMetadata.Project(o); err != nil {
			t.Fatalf("metadata view: %v", err)
		}
	})
}

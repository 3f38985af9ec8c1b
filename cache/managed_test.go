package cache

import (
	"bytes"
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSharedManagedFieldsServeTheObjectWhole: Pods and ConfigMaps decoded
// from a watch, in JSON and protobuf, are served (Bytes, Buffers) exactly
// as the API server sent them; objects of one owner share their
// managedFields' shape; Data stays an object of its kind that decodes,
// with the same spec and status, for the readers of Data that do not read
// managedFields.
func TestSharedManagedFieldsServeTheObjectWhole(t *testing.T) {
	for _, tc := range []struct {
		name    string
		newObj  objectFunc
		idx     []int // objects; the first two share a shape (in protobuf: IPs of one length)
		decoded func() any
	}{
		{"pod", apiServerPod, []int{10, 60, 1}, func() any { return &corev1.Pod{} }},
		{"configmap", apiServerConfigMap, []int{0, 1}, func() any { return &corev1.ConfigMap{} }},
	} {
		for _, enc := range []string{"json", "protobuf"} {
			t.Run(tc.name+"/"+enc, func(t *testing.T) {
				in := newInterner()
				var objs []*Object
				var want [][]byte
				for _, i := range tc.idx {
					body := watchEvents(t, tc.newObj, enc, 1, i)
					want = append(want, eventObject(t, body, enc))
					objs = append(objs, decodeWatchBody(t, body, in)...)
				}
				for i, o := range objs {
					if o.mf == nil {
						t.Fatalf("object %d: managedFields not shared", i)
					}
					if got := o.Bytes(); !bytes.Equal(got, want[i]) {
						t.Errorf("object %d served as\n%q\nwant\n%q", i, got, want[i])
					}
					if got := bytes.Join(o.Buffers(), nil); !bytes.Equal(got, want[i]) {
						t.Errorf("object %d: buffers differ from the object", i)
					}
					if len(o.Data) >= len(want[i]) {
						t.Errorf("object %d keeps %d bytes of %d", i, len(o.Data), len(want[i]))
					}
					if cap(o.Data) != len(o.Data) {
						t.Errorf("object %d: %d bytes stored with a capacity of %d", i, len(o.Data), cap(o.Data))
					}
					full, cut := tc.decoded(), tc.decoded()
					decodeAs(t, enc, want[i], full)
					decodeAs(t, enc, o.Data, cut)
					clearManagedFields(full)
					clearManagedFields(cut)
					if a, b := mustJSON(t, full), mustJSON(t, cut); !bytes.Equal(a, b) {
						t.Errorf("object %d: Data decodes as\n%s\nwant\n%s", i, b, a)
					}
				}
				if objs[0].mf != objs[1].mf {
					t.Error("objects of one owner do not share their managedFields' shape")
				}
			})
		}
	}
}

// TestManagedFieldsRoundTrip: whatever managedFields look like, an object
// is served as it came; where they hold no holes, or odd ones, too.
func TestManagedFieldsRoundTrip(t *testing.T) {
	for _, tc := range []struct{ name, obj string }{
		{"no holes", `{"metadata":{"name":"a","managedFields":[{"manager":"m"}]}}`},
		{"empty", `{"metadata":{"managedFields":[]}}`},
		{"not a time", `{"metadata":{"managedFields":[{"time":"yesterday"},{"time":"2026-01-02T03:04:05Z"}]}}`},
		{"escaped time", `{"metadata":{"managedFields":[{"time":"2026-01-02T03:04:05\u005a"}]}}`},
		{"ip keys", `{"metadata":{"managedFields":[{"fieldsV1":{"k:{\"ip\":\"1.2.3.4\"}":{},"k:{\"ip\":\"::1\"}" : {}}}]}}`},
		{"ip value", `{"metadata":{"managedFields":[{"x":"k:{\"ip\":\"1\"}"},{"y":["k:{\"ip\":\"2\"}"]}]}}`},
		{"spaces", ` { "metadata" : { "managedFields" : [ { "time" : "2026-01-02T03:04:05Z" , "fieldsV1" : { } } ] } } `},
		{"second metadata", `{"metadata":{"name":"a"},"metadata":{"managedFields":[{"time":"2026-01-02T03:04:05Z"}]}}`},
		{"second managedFields", `{"metadata":{"managedFields":[{"time":"2026-01-02T03:04:05Z"}],"managedFields":[{"time":"2026-01-02T03:04:06Z"}]}}`},
		{"not an array", `{"metadata":{"managedFields":{"time":"2026-01-02T03:04:05Z"}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			roundTrip(t, newInterner(), []byte(tc.obj))
		})
	}
}

// roundTrip decodes raw, keeping managedFields, shares them through in,
// and checks that the object is served as raw.
func roundTrip(t *testing.T, in *interner, raw []byte) *Object {
	t.Helper()
	o, _, err := decodeAnyObject(raw, false)
	if err != nil {
		return nil
	}
	in.object(o)
	if got := o.Bytes(); !bytes.Equal(got, raw) {
		t.Fatalf("%q served as %q (Data %q)", raw, got, o.Data)
	}
	if o.mf != nil {
		if _, _, err := decodeAnyObject(o.Data, false); err != nil {
			t.Fatalf("%q kept as %q, which does not decode: %v", raw, o.Data, err)
		}
	}
	return o
}

// FuzzShareManagedFields: any object, in JSON or protobuf, is served as it
// came, its managedFields shared or not.
func FuzzShareManagedFields(f *testing.F) {
	for _, seed := range decodeSeeds {
		f.Add([]byte(seed))
	}
	for _, enc := range []string{"json", "protobuf"} {
		f.Add(eventObject(f, watchEvents(f, apiServerPod, enc, 1, 7), enc))
		f.Add(eventObject(f, watchEvents(f, apiServerConfigMap, enc, 1, 7), enc))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		in := newInterner()
		roundTrip(t, in, raw)
		roundTrip(t, in, raw) // a shared shape
	})
}

// eventObject returns the object of the only event of a watch body.
func eventObject(tb testing.TB, body []byte, enc string) []byte {
	tb.Helper()
	if enc == "protobuf" {
		var ev metav1.WatchEvent
		if err := ev.Unmarshal(body[4:]); err != nil {
			tb.Fatal(err)
		}
		return ev.Object.Raw
	}
	var ev struct {
		Object json.RawMessage `json:"object"`
	}
	if err := json.Unmarshal(body, &ev); err != nil {
		tb.Fatal(err)
	}
	return ev.Object
}

func decodeAs(t *testing.T, enc string, data []byte, into any) {
	t.Helper()
	mediaType := "application/json"
	if enc == "protobuf" {
		mediaType = "application/vnd.kubernetes.protobuf"
	}
	obj, _, err := serializer(t, mediaType).Decode(data, nil, nil)
	if err != nil {
		t.Fatalf("%q does not decode: %v", data, err)
	}
	b := mustJSON(t, obj)
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatal(err)
	}
}

func clearManagedFields(o any) {
	if m, ok := o.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// BenchmarkManagedFields weighs, per object, what the daemon pays to read
// an object from a watch (decode, and intern what objects repeat) and to
// write it in the full view (its buffers) with managedFields stripped, the
// former default, and kept and shared, the default: a Pod and a 1 KiB
// ConfigMap of TestHeapPerStoredObject, in JSON and protobuf.
func BenchmarkManagedFields(b *testing.B) {
	for _, kind := range []struct {
		name   string
		newObj objectFunc
	}{{"pod", apiServerPod}, {"configmap", apiServerConfigMap}} {
		for _, enc := range []string{"json", "protobuf"} {
			data := eventObject(b, watchEvents(b, kind.newObj, enc, 1, 7), enc)
			for _, strip := range []bool{true, false} {
				mode := "share"
				if strip {
					mode = "strip"
				}
				in := newInterner()
				read := func() *Object {
					o, _, err := decodeAnyObject(data, strip)
					if err != nil {
						b.Fatal(err)
					}
					if len(o.Data) > 0 && &o.Data[0] == &data[0] {
						o.Data = bytes.Clone(data) // as a watch does
					}
					in.object(o)
					return o
				}
				b.Run(kind.name+"/"+enc+"/"+mode+"/read", func(b *testing.B) {
					b.SetBytes(int64(len(data)))
					b.ReportAllocs()
					for b.Loop() {
						read()
					}
				})
				o := read()
				b.Run(kind.name+"/"+enc+"/"+mode+"/write", func(b *testing.B) {
					b.ReportAllocs()
					n := 0
					for b.Loop() {
						n += len(o.Buffers())
					}
					b.ReportMetric(float64(n)/float64(b.N), "buffers/op")
				})
			}
		}
	}
}

// TestSharedManagedFieldsWithResourceVersion: a deletion stamps the
// object's last state with a newer resourceVersion; it is still served
// whole, managedFields included.
func TestSharedManagedFieldsWithResourceVersion(t *testing.T) {
	for _, enc := range []string{"json", "protobuf"} {
		t.Run(enc, func(t *testing.T) {
			body := watchEvents(t, apiServerPod, enc, 1, 3)
			o := decodeWatchBody(t, body, newInterner())[0]
			stamped := o.withResourceVersion("99999")
			if stamped.mf == nil || stamped.ResourceVersion != "99999" {
				t.Fatalf("stamped object: shape %v, resourceVersion %q", stamped.mf, stamped.ResourceVersion)
			}
			var want, got corev1.Pod
			decodeAs(t, enc, eventObject(t, body, enc), &want)
			decodeAs(t, enc, stamped.Bytes(), &got)
			want.ResourceVersion = "99999"
			if a, b := mustJSON(t, want), mustJSON(t, got); !bytes.Equal(a, b) {
				t.Errorf("stamped object served as\n%s\nwant\n%s", b, a)
			}
		})
	}
}

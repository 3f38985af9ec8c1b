package cache

import (
	"bytes"
	"io"
	"testing"
)

// FuzzDecodeObject: whatever the API server (or a proxy in between) sends,
// decoding an object and adding type metadata return an error or a usable
// object; neither panics, and stripping managedFields keeps valid JSON.
func FuzzDecodeObject(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"n","resourceVersion":"5","labels":{"x":"y"},"managedFields":[{"manager":"m"}]},"data":{"k":"v"}}`))
	f.Add([]byte(`{"metadata":{"name":"a"}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"metadata":null,"kind":7}`))
	tm := []byte(`{"apiVersion":"v1","kind":"ConfigMap",`)
	f.Fuzz(func(t *testing.T, raw []byte) {
		o, err := decodeObject(raw, true)
		if err != nil {
			return
		}
		if _, err := ViewMetadata.Project(o); err != nil {
			t.Fatalf("metadata view of a decoded object %s: %v", o.JSON, err)
		}
		typed, err := withTypeMeta(raw, tm)
		if err != nil {
			return
		}
		if _, err := decodeObject(typed, true); err != nil {
			t.Fatalf("withTypeMeta(%s) = %s, which does not decode: %v", raw, typed, err)
		}
	})
}

// FuzzWatchStream: whatever bytes a watch response carries, the stream
// decoder yields events or an error; it never panics, and every object
// event carries an object.
func FuzzWatchStream(f *testing.F) {
	f.Add([]byte(`{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"2"}}}` + "\n" +
		`{"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"3","annotations":{"k8s.io/initial-events-end":"true"}}}}`))
	f.Add([]byte(`{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}`))
	f.Add([]byte(`{"type":"MODIFIED","object":null}{"type":"NOPE"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ws := newJSONWatchStream(io.NopCloser(bytes.NewReader(b)), true)
		defer ws.close()
		for range 100 {
			typ, obj, _, err := ws.next()
			if err != nil {
				return
			}
			if typ != Bookmark && obj == nil {
				t.Fatalf("%s event without an object", typ)
			}
		}
	})
}

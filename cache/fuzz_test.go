package cache

import "testing"

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

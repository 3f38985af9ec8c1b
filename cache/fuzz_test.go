package cache

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// FuzzDecodeObject holds the one-pass decoder to encoding/json: for any
// input both reject it, or both read the same type and metadata and the
// stripped JSON is the same document without managedFields.
func FuzzDecodeObject(f *testing.F) {
	for _, seed := range decodeSeeds {
		f.Add([]byte(seed))
	}
	tm := []byte(`{"apiVersion":"v1","kind":"ConfigMap",`)
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, wantH, wantDoc, wantErr := referenceDecode(raw, true)
		got, gotH, err := decodeObject(raw, true)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("decodeObject(%q): error %v, encoding/json: %v", raw, err, wantErr)
		}
		if err != nil {
			return
		}
		compareDecoded(t, raw, got, want, gotH, wantH, wantDoc)
		if _, err := ViewMetadata.Project(got); err != nil {
			t.Fatalf("metadata view of %s: %v", got.Data, err)
		}
		typed := withTypeMeta(got.Data, tm)
		if _, _, err := decodeObject(typed, true); err != nil {
			t.Fatalf("withTypeMeta gave %s, which does not decode: %v", typed, err)
		}
	})
}

var decodeSeeds = []string{
	`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"n","resourceVersion":"5","labels":{"x":"y"},"managedFields":[{"manager":"m"}]},"data":{"k":"v"}}`,
	`{"metadata":{"managedFields":[{"manager":"m"}], "name":"a"}}`,
	`{"metadata":{"managedFields":null}}`,
	`{"metadata":{"name":"a","managedFields":[], "uid" : "u" }}`,
	`{"metadata":{"managedFields":1,"managedFields":2}}`,
	`{"metadata":{"name":"a"},"metadata":{"uid":"b"}}`,
	`{"meta\u0064ata":{"na\u006de":"\u00e9"}}`,
	`{"metadata":{"labels":{"a":null,"b":"\"q\""}}}`,
	`{"n":[1,-0.5e+3,true,false,null,{"a":[[]]}],"s":"\ud83d\ude00"}`,
	`{}`, `[]`, `null`, ``, `{"metadata":null,"kind":7}`, `{"a":01}`, `{"a":1.}`, `{"a":"\x"}`, `{"a":tru}`, `{} x`, "{}\x00", "{\"a\":\"\x01\"}",
}

// referenceDecode is decodeObject written with encoding/json: the
// specification the fuzz test holds the scanner to.
func referenceDecode(raw []byte, strip bool) (*Object, header, any, error) {
	doc, err := decodeDoc(raw)
	if err != nil {
		return nil, header{}, nil, err
	}
	top, ok := doc.(map[string]any)
	if !ok {
		return nil, header{}, nil, errors.New("not an object")
	}
	text := func(m map[string]any, k string) (string, error) {
		switch v := m[k].(type) {
		case nil:
			return "", nil
		case string:
			return v, nil
		}
		return "", fmt.Errorf("%s is not a string", k)
	}
	o := &Object{}
	var h header
	var errs [8]error
	h.apiVersion, errs[0] = text(top, "apiVersion")
	h.kind, errs[1] = text(top, "kind")
	switch meta := top["metadata"].(type) {
	case nil:
	case map[string]any:
		o.Namespace, errs[2] = text(meta, "namespace")
		o.Name, errs[3] = text(meta, "name")
		h.uid, errs[4] = text(meta, "uid")
		o.ResourceVersion, errs[5] = text(meta, "resourceVersion")
		switch l := meta["labels"].(type) {
		case nil:
		case map[string]any:
			o.Labels = labels.Set{}
			for k := range l {
				o.Labels[k], errs[6] = text(l, k)
				if errs[6] != nil {
					break
				}
			}
		default:
			errs[6] = errors.New("labels is not an object")
		}
		if strip {
			delete(meta, "managedFields")
		}
	default:
		errs[7] = errors.New("metadata is not an object")
	}
	return o, h, top, errors.Join(errs[:]...)
}

// decodeDoc decodes one JSON document, numbers as text.
func decodeDoc(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the document")
	}
	return doc, nil
}

func compareDecoded(t *testing.T, raw []byte, got, want *Object, gotH, wantH header, wantDoc any) {
	t.Helper()
	if gotH != wantH || got.Namespace != want.Namespace || got.Name != want.Name || got.ResourceVersion != want.ResourceVersion ||
		!maps.Equal(got.Labels, want.Labels) || (got.Labels == nil) != (want.Labels == nil) {
		t.Fatalf("decodeObject(%q) = %+v %+v, encoding/json reads %+v %+v", raw, *got, gotH, *want, wantH)
	}
	gotDoc, err := decodeDoc(got.Data)
	if err != nil {
		t.Fatalf("decodeObject(%q) returned JSON %q that does not decode: %v", raw, got.Data, err)
	}
	if !reflect.DeepEqual(gotDoc, wantDoc) {
		t.Fatalf("decodeObject(%q) returned %s, want the document %v", raw, got.Data, wantDoc)
	}
}

func TestDecodeObject(t *testing.T) {
	for _, seed := range decodeSeeds {
		want, wantH, wantDoc, wantErr := referenceDecode([]byte(seed), true)
		got, gotH, err := decodeObject([]byte(seed), true)
		if (err != nil) != (wantErr != nil) {
			t.Errorf("decodeObject(%q): error %v, encoding/json: %v", seed, err, wantErr)
			continue
		}
		if err == nil {
			compareDecoded(t, []byte(seed), got, want, gotH, wantH, wantDoc)
		}
	}
	// Stripping keeps the bytes around managedFields as they were.
	for in, want := range map[string]string{
		`{"metadata":{"name":"a","managedFields":[{"m":"x"}]},"data":{}}`:  `{"metadata":{"name":"a"},"data":{}}`,
		`{"metadata":{"managedFields":[{"m":"x"}] , "name":"a"}}`:          `{"metadata":{ "name":"a"}}`,
		`{"metadata":{"managedFields":[]}}`:                                `{"metadata":{}}`,
		`{"metadata":{"a":1,"managedFields":[],"b":2,"managedFields":[]}}`: `{"metadata":{"a":1,"b":2}}`,
	} {
		got, _, err := decodeObject([]byte(in), true)
		if err != nil || string(got.Data) != want {
			t.Errorf("decodeObject(%s) = %s, %v; want %s", in, got.Data, err, want)
		}
		kept, _, err := decodeObject([]byte(in), false)
		if err != nil || string(kept.Data) != in {
			t.Errorf("decodeObject(%s) without strip changed the bytes: %s, %v", in, kept.Data, err)
		}
	}
}

// FuzzWatchStream: whatever bytes a watch response carries, the stream
// decoder yields events or an error; it never panics, and every object
// event carries an object.
func FuzzWatchStream(f *testing.F) {
	f.Add([]byte(`{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","resourceVersion":"2"}}}` + "\n" +
		`{"type":"BOOKMARK","object":{"kind":"ConfigMap","metadata":{"resourceVersion":"3","annotations":{"k8s.io/initial-events-end":"true"}}}}`))
	f.Add([]byte(`{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired"}}`))
	f.Add([]byte(`{"type":"MODIFIED","object":null}{"type":"NOPE"}`))
	cm := formatConfigMap()
	f.Add(append(watchFrame(f, "ADDED", cm), watchFrame(f, "BOOKMARK", cm)...))
	f.Add(watchFrame(f, "ERROR", &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Code: 410}))
	f.Fuzz(func(t *testing.T, b []byte) {
		ws := newRawWatchStream(io.NopCloser(bytes.NewReader(b)), true, newInterner())
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

// BenchmarkDecodeObject compares the one-pass decoder with what it
// replaced: encoding/json for the metadata, and a re-encoding of the
// object without managedFields.
func BenchmarkDecodeObject(b *testing.B) {
	raw := []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm-00042","namespace":"bench","uid":"6f1c0d2e-3b4a-4c5d-8e9f-0a1b2c3d4e5f","resourceVersion":"123456","creationTimestamp":"2026-12-02T15:00:00Z","labels":{"app":"bench","shard":"3"},"annotations":{"bench.informerd.io/written":"1796223600000000000"},"managedFields":[{"manager":"bench","operation":"Update","apiVersion":"v1","time":"2026-12-02T15:00:00Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:payload":{}},"f:metadata":{"f:annotations":{".":{},"f:bench.informerd.io/written":{}},"f:labels":{".":{},"f:app":{},"f:shard":{}}}}}]},"data":{"payload":"` +
		strings.Repeat("abcdefghijklmnopqrstuvwxyz", 40) + `"}}`)
	b.Run("one-pass", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := decodeObject(raw, true); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(raw)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encodingJSONDecode(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// encodingJSONDecode is the decoder before the one-pass scanner, kept
// for BenchmarkDecodeObject.
func encodingJSONDecode(raw []byte) (*Object, error) {
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
		return nil, err
	}
	o := &Object{Namespace: h.Metadata.Namespace, Name: h.Metadata.Name,
		ResourceVersion: h.Metadata.ResourceVersion, Labels: h.Metadata.Labels, Data: raw}
	if len(h.Metadata.ManagedFields) > 0 {
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
		if o.Data, err = json.Marshal(top); err != nil {
			return nil, err
		}
	}
	return o, nil
}

package cache

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"
	"unsafe"

	"k8s.io/apimachinery/pkg/labels"
)

// maxInterned bounds each generation of an interner: strings and label
// sets alike. An interner holds at most two generations.
const maxInterned = 4096

// interner shares what many objects repeat, so that the store keeps one
// copy of each: namespaces, apiVersions and kinds, whole label sets (the
// Pods of one ReplicaSet have the same labels), whose strings are shared
// too, and the shapes of managedFields (see share). Objects are immutable,
// so sharing a label set is safe.
//
// It is bounded: entries go in a current generation; when that is full
// (shapes: by number or by bytes, maxShapesBytes),
// it becomes the previous one and the previous one is dropped. An entry
// found in the previous generation moves to the current one, so that what
// keeps being used stays shared. Dropping an entry costs sharing, never
// correctness. A nil *interner shares nothing. Safe for concurrent use:
// a Manager's Sources share one.
type interner struct {
	mu         sync.Mutex // guards the fields below
	strs, prev map[string]string
	sets, prvs map[string]labels.Set // by setKey
	keys       []string              // scratch for setKey
	key        []byte                // scratch for setKey

	shapes, prevShapes map[uint64]*mfShape // by hash of their pieces
	shapesBytes        int                 // the bytes of shapes
	pieces, prevPieces map[uint64][]byte   // the large pieces of shapes, by hash
	piecesBytes        int                 // the bytes of pieces
	seed               maphash.Seed        // of the hashes
}

func newInterner() *interner {
	return &interner{strs: map[string]string{}, sets: map[string]labels.Set{},
		shapes: map[uint64]*mfShape{}, pieces: map[uint64][]byte{}, seed: maphash.MakeSeed()}
}

// object replaces o's namespace and labels with shared copies, shares its
// managedFields, and makes its resourceVersion a view of the same bytes in
// Data, which are immutable, instead of a copy. (Not its name: other
// indexes keep names as map keys, which would keep older versions' bytes
// alive.) o must not be published yet, and its Data must be its own.
func (in *interner) object(o *Object) {
	if in == nil {
		return
	}
	in.share(o)
	o.ResourceVersion = within(o.Data, o.ResourceVersion)
	in.mu.Lock()
	defer in.mu.Unlock()
	o.Namespace = in.str(o.Namespace)
	o.Labels = in.labelSet(o.Labels)
}

// within returns s, as a view of the same bytes in b if b holds them: a
// string that costs no allocation of its own. b must never change.
func within(b []byte, s string) string {
	if i := bytes.Index(b, []byte(s)); s != "" && i >= 0 {
		return unsafe.String(&b[i], len(s))
	}
	return s
}

// str returns the shared copy of s. in.mu must be held.
func (in *interner) str(s string) string {
	if s == "" {
		return ""
	}
	if v, ok := in.strs[s]; ok {
		return v
	}
	v, ok := in.prev[s]
	if !ok {
		v = s
	}
	if len(in.strs) >= maxInterned {
		in.prev, in.strs = in.strs, make(map[string]string, len(in.strs))
	}
	in.strs[v] = v
	return v
}

// labelSet returns the shared copy of l, equal to it. in.mu must be held.
func (in *interner) labelSet(l labels.Set) labels.Set {
	if len(l) == 0 {
		return nil
	}
	key := in.setKey(l)
	if v, ok := in.sets[string(key)]; ok {
		return v
	}
	v, ok := in.prvs[string(key)]
	if !ok {
		v = make(labels.Set, len(l))
		for k, val := range l {
			v[in.str(k)] = in.str(val)
		}
	}
	if len(in.sets) >= maxInterned {
		in.prvs, in.sets = in.sets, make(map[string]labels.Set, len(in.sets))
	}
	in.sets[string(key)] = v
	return v
}

// setKey encodes l canonically, in a scratch buffer valid until the next
// call: its pairs sorted by key, each string length-prefixed.
func (in *interner) setKey(l labels.Set) []byte {
	in.keys = in.keys[:0]
	for k := range l {
		in.keys = append(in.keys, k)
	}
	slices.Sort(in.keys)
	b := in.key[:0]
	for _, k := range in.keys {
		for _, s := range [2]string{k, l[k]} {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	clear(in.keys) // keep no object's strings alive
	in.key = b
	return b
}

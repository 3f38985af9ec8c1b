package cache

import (
	"encoding/binary"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/labels"
)

// maxInterned bounds each generation of an interner: strings and label
// sets alike. An interner holds at most two generations.
const maxInterned = 4096

// interner shares what many objects repeat, so that the store keeps one
// copy of each: namespaces, apiVersions and kinds, and whole label sets
// (the Pods of one ReplicaSet have the same labels), whose strings are
// shared too. Objects are immutable, so sharing a label set is safe.
//
// It is bounded: entries go in a current generation; when that is full,
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
}

func newInterner() *interner {
	return &interner{strs: map[string]string{}, sets: map[string]labels.Set{}}
}

// object replaces o's namespace and labels with shared copies. o must not be published yet.
func (in *interner) object(o *Object) {
	if in == nil {
		return
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	o.Namespace = in.str(o.Namespace)
	o.Labels = in.labelSet(o.Labels)
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

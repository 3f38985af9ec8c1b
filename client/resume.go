package client

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/informerd/informerd/internal/snapdiff"
)

// The client-go adapters (NewListerWatcher, the factory, the dynamic
// client) answer a RESET with the changes it stands for, as a resumed watch
// of the API server would, rather than with 410 Expired: on 410 client-go's
// reflector relists only after its backoff (0.8 s or more, doubling within
// two minutes), and a new daemon, which cannot know a restarted client's
// resume point, RESETs every stream it is asked to resume.
//
// To do that a watch needs what its receiver holds. A watch keeps the
// objects it delivered (the reflector's store holds the same objects),
// starting from those of the List it resumes from: a List leaves what it
// returned, keyed by request and resourceVersion, and the reflector's
// watch that follows takes it. A RESET's fresh snapshot is compared with
// them (internal/snapdiff, the difference the daemon's relist and Watcher
// compute too): the watch sends DELETED for the objects gone, ADDED and
// MODIFIED for the new and changed ones, in snapdiff's order, and a
// bookmark at the snapshot. A watch
// with nothing to compare with (a resume point no List of this Client
// returned, or one left more than resumeTTL ago) still ends with 410.

// resumeTTL is how long a List's result waits for the watch resuming from
// it. client-go's reflector watches at once after a List, so it is taken
// within milliseconds; the TTL frees those of a List no watch follows.
const resumeTTL = 10 * time.Second

// objectKey names an object in a resource.
type objectKey struct{ namespace, name string }

// delivered is what a reflector holds after a List or watch: its objects
// by key.
type delivered map[objectKey]runtime.Object

// resumeKey is a request, without what does not change its objects, and
// a resourceVersion.
type resumeKey struct {
	opts WatchOptions
	rv   string
}

func newResumeKey(opts WatchOptions, rv string) resumeKey {
	opts.ClientName, opts.NotOlderThan, opts.WaitForResource, opts.ExistingInformerOnly = "", "", false, false
	return resumeKey{opts, rv}
}

// resumes holds what Lists delivered, for resumeTTL or until taken.
type resumes struct {
	mu sync.Mutex // guards m
	m  map[resumeKey]*left
}

// left is what resumes holds for one key.
type left struct{ d delivered }

// leave keeps d for the watch of opts that resumes from rv.
func (r *resumes) leave(opts WatchOptions, rv string, d delivered) {
	if d == nil || rv == "" {
		return
	}
	k, l := newResumeKey(opts, rv), &left{d}
	r.mu.Lock()
	if r.m == nil {
		r.m = map[resumeKey]*left{}
	}
	r.m[k] = l
	r.mu.Unlock()
	time.AfterFunc(resumeTTL, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.m[k] == l {
			delete(r.m, k)
		}
	})
}

// take returns and forgets what was left for a watch of opts resuming from
// rv, or nil.
func (r *resumes) take(opts WatchOptions, rv string) delivered {
	k := newResumeKey(opts, rv)
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.m[k]
	if l == nil {
		return nil
	}
	delete(r.m, k)
	return l.d
}

// keyOf returns obj's key and metadata; ok is false for an object without
// metadata.
func keyOf(obj runtime.Object) (objectKey, metav1.Object, bool) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return objectKey{}, nil, false
	}
	return objectKey{m.GetNamespace(), m.GetName()}, m, true
}

// apply records an event the reflector received.
func (d delivered) apply(t watch.EventType, obj runtime.Object) {
	k, _, ok := keyOf(obj)
	if !ok {
		return
	}
	switch t {
	case watch.Added, watch.Modified:
		d[k] = obj
	case watch.Deleted:
		delete(d, k)
	}
}

// changesTo returns the events that take a reflector holding d to fresh,
// a snapshot, in snapdiff's order and by its rule: DELETED for what fresh
// lacks or holds under another UID (the object as delivered, carrying
// deletedAt, the reflector's position before the snapshot, from which it
// replays the rest if it resumes there), then ADDED and MODIFIED in
// ascending order of their resourceVersions.
func (d delivered) changesTo(fresh delivered, deletedAt string) []watch.Event {
	changes := snapdiff.Diff(slices.Values(d.sorted()), fresh.sorted(), entryAccessors)
	evs := make([]watch.Event, 0, len(changes))
	for _, c := range changes {
		obj, t := c.Object.obj, watch.Modified
		switch c.Type {
		case snapdiff.Deleted:
			t, obj = watch.Deleted, obj.DeepCopyObject()
			if m, err := meta.Accessor(obj); err == nil {
				m.SetResourceVersion(deletedAt)
			}
		case snapdiff.Added:
			t = watch.Added
		}
		evs = append(evs, watch.Event{Type: t, Object: obj})
	}
	return evs
}

// entry is a delivered object with its key and metadata, for snapdiff.
type entry struct {
	key  objectKey
	obj  runtime.Object
	meta metav1.Object
}

// sorted returns d's objects ordered by key.
func (d delivered) sorted() []entry {
	out := make([]entry, 0, len(d))
	for k, obj := range d {
		_, m, _ := keyOf(obj) // d holds only objects with metadata
		out = append(out, entry{k, obj, m})
	}
	slices.SortFunc(out, entryAccessors.Compare)
	return out
}

var entryAccessors = snapdiff.Accessors[entry]{
	Compare: func(a, b entry) int {
		return cmp.Or(strings.Compare(a.key.namespace, b.key.namespace), strings.Compare(a.key.name, b.key.name))
	},
	ResourceVersion: func(e entry) string { return e.meta.GetResourceVersion() },
	UID:             func(e entry) string { return string(e.meta.GetUID()) },
}

package address

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/internal/backoff"
)

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// Kinds of updates: related kinds are numbered from 0 in the order of
// Options.Related; the others are negative.
const (
	podKind = -1
	rsKind  = -2
	jobKind = -3
)

// The kinds whose controllers are a pod's workload, in slot order (the
// index's owners).
var (
	ownerKinds     = [2]int{rsKind, jobKind}
	ownerKindNames = [2]string{"ReplicaSet", "Job"}
	ownerResources = [2]schema.GroupVersionResource{
		{Group: "apps", Version: "v1", Resource: "replicasets"},
		{Group: "batch", Version: "v1", Resource: "jobs"},
	}
)

// ownerSlot returns the slot of rsKind or jobKind.
func ownerSlot(kind int) (int, bool) {
	i := slices.Index(ownerKinds[:], kind)
	return i, i >= 0
}

// batchSize is how many events a reader takes from its subscription at a
// time.
const batchSize = 256

// Attempts to watch a related kind whose resource was removed are spaced
// from minRewatch doubling to maxRewatch, so that a stale discovery answer
// cannot spin.
const (
	minRewatch = time.Second
	maxRewatch = 30 * time.Second
)

// instance is one set of subscriptions and the index over them. Its
// goroutines (one reader per subscription, one owner of the index) end
// when stop cancels ctx.
type instance struct {
	opts   *Options
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// in carries the readers' updates, in order per reader, to the owner.
	// Unbuffered: a reader waits for the owner, and the cache's log holds
	// what it has not read yet.
	in chan update

	// refs counts the watches; guarded by Tracker.mu.
	refs int

	mu  sync.Mutex // guards idx, err, unsynced, wl and wlGen
	idx *index
	// err is set when the instance can answer no more.
	err error
	// unsynced are the kinds not read in full yet: podKind and each
	// related kind.
	unsynced map[int]bool
	// wl reads the ReplicaSets and Jobs while a watch asks for workloads;
	// nil while none does. wlGen numbers its starts.
	wl    *workloads
	wlGen int
}

// workloads are the readers of ReplicaSets and Jobs, shared by the
// watches that ask for workloads: started with the first, stopped with
// the last. Its fields are guarded by instance.mu.
type workloads struct {
	refs   int
	gen    int
	cancel context.CancelFunc
	// synced is closed once both kinds have been read in full (or found
	// unavailable); unsynced are those not yet.
	synced   chan struct{}
	unsynced map[int]bool
}

// update is what a reader hands the owner: a batch of changes of one kind
// or the error that stopped the reader.
type update struct {
	kind int
	// gen is the workloads generation of a ReplicaSet or Job reader.
	gen int
	// replace says that the changes are the kind's whole set: a snapshot.
	replace bool
	// missing, with replace and no changes, says that the kind cannot be
	// read, and why: it has no objects and answers name it Unavailable.
	missing string
	pods    []change[*Pod]
	related []change[*relObj]
	owners  []change[*ownerObj]
	err     error
}

// change is the new state of one object; obj is nil when the object is
// gone (or, for a pod, is no answer).
type change[T any] struct {
	key objKey
	obj T
}

// start starts an instance.
func (t *Tracker) start() *instance {
	inst := &instance{
		opts: &t.opts, log: t.log, in: make(chan update),
		idx: newIndex(t.opts.Related), unsynced: map[int]bool{podKind: true},
	}
	for i := range t.opts.Related {
		inst.unsynced[i] = true
	}
	inst.ctx, inst.cancel = context.WithCancel(context.Background())
	inst.wg.Add(2 + len(t.opts.Related))
	go inst.own()
	go inst.readPods()
	for i := range t.opts.Related {
		kind := &t.opts.Related[i]
		go readKind(inst, inst.ctx, i, 0, kind.Resource, func(o *cache.Object) *relObj {
			r, err := kind.decode(o)
			if err != nil {
				inst.log.Warn("address: related object selects nothing", "resource", kind.Resource.String(), "object", keyString(keyOf(o)), "err", err)
			}
			return r
		}, func(u *update, cs []change[*relObj]) { u.related = cs })
	}
	return inst
}

// startWorkloads starts the ReplicaSet and Job readers; inst.mu is held.
func (inst *instance) startWorkloads() {
	inst.wlGen++
	ctx, cancel := context.WithCancel(inst.ctx)
	wl := &workloads{gen: inst.wlGen, cancel: cancel, synced: make(chan struct{}), unsynced: map[int]bool{rsKind: true, jobKind: true}}
	inst.wl = wl
	inst.wg.Add(len(ownerKinds))
	for slot, kind := range ownerKinds {
		go readKind(inst, ctx, kind, wl.gen, ownerResources[slot], func(o *cache.Object) *ownerObj {
			r, err := decodeOwner(o)
			if err != nil {
				inst.log.Warn("address: owner ignored", "resource", ownerResources[slot].String(), "object", keyString(keyOf(o)), "err", err)
			}
			return r
		}, func(u *update, cs []change[*ownerObj]) { u.owners = cs })
	}
}

// stop ends the instance's goroutines and waits for them.
func (inst *instance) stop() {
	inst.cancel()
	inst.wg.Wait()
}

func (inst *instance) failed() bool {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return inst.err != nil
}

// add registers a watch of addr; with workload, it holds the workload
// readers (starting them if it is the first), returned with it.
func (inst *instance) add(addr netip.AddrPort, workload bool) (*entry, *workloads) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	var wl *workloads
	if workload && inst.err == nil {
		if inst.wl == nil {
			inst.startWorkloads()
		}
		wl = inst.wl
		wl.refs++
	}
	return inst.idx.add(addr, inst.err), wl
}

// remove unregisters a watch, and its hold on wl if not nil: the last one
// stops the workload readers, and answers carry no workloads any more.
func (inst *instance) remove(e *entry, wl *workloads) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	inst.idx.remove(e)
	if wl == nil {
		return
	}
	if wl.refs--; wl.refs > 0 || inst.wl != wl {
		return
	}
	wl.cancel()
	inst.wl = nil
	if inst.err == nil {
		inst.idx.clearOwners()
		inst.idx.flush()
	}
}

// own applies the readers' updates until the instance stops or fails.
func (inst *instance) own() {
	defer inst.wg.Done()
	for {
		select {
		case <-inst.ctx.Done():
			return
		case u := <-inst.in:
			if !inst.apply(u) {
				return
			}
		}
	}
}

// apply applies one update under the lock; it returns false once the
// instance has failed.
func (inst *instance) apply(u update) bool {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	x := inst.idx
	if u.err != nil {
		inst.err = u.err
		x.publishAll(u.err)
		inst.log.Warn("address answers stopped", "err", u.err)
		return false
	}
	if slot, ok := ownerSlot(u.kind); ok {
		return inst.applyOwners(slot, u)
	}
	if u.kind == podKind {
		if u.replace {
			inst.replacePods(u.pods)
		}
		for _, c := range u.pods {
			x.setPod(c.key, c.obj)
		}
	} else {
		if u.replace {
			inst.replaceRelated(u.kind, u.related)
			x.setMissing(u.kind, u.missing)
		}
		for _, c := range u.related {
			x.setRelated(u.kind, c.key, c.obj)
		}
	}
	if u.replace && inst.unsynced[u.kind] {
		delete(inst.unsynced, u.kind)
		if len(inst.unsynced) == 0 {
			x.synced = true
			x.publishAll(nil)
			return true
		}
	}
	x.flush()
	return true
}

// applyOwners applies an update of ReplicaSets (slot 0) or Jobs (slot 1),
// unless it comes from readers since stopped; with inst.mu held.
func (inst *instance) applyOwners(slot int, u update) bool {
	x, wl := inst.idx, inst.wl
	if wl == nil || wl.gen != u.gen {
		return true
	}
	if u.replace {
		keep := make(map[objKey]bool, len(u.owners))
		for _, c := range u.owners {
			keep[c.key] = true
		}
		for k := range x.owners[slot] {
			if !keep[k] {
				x.setOwner(slot, k, nil)
			}
		}
		x.setMissing(u.kind, u.missing)
	}
	for _, c := range u.owners {
		x.setOwner(slot, c.key, c.obj)
	}
	if u.replace && wl.unsynced[u.kind] {
		delete(wl.unsynced, u.kind)
		if len(wl.unsynced) == 0 {
			x.workloads = true
			x.markAll()
			x.flush()
			close(wl.synced)
			return true
		}
	}
	x.flush()
	return true
}

// replacePods removes the pods a snapshot does not have; its changes are
// applied next.
func (inst *instance) replacePods(snap []change[*Pod]) {
	x := inst.idx
	keep := make(map[objKey]bool, len(snap))
	for _, c := range snap {
		keep[c.key] = true
	}
	for k := range x.pods {
		if !keep[k] {
			x.setPod(k, nil)
		}
	}
}

// replaceRelated removes the objects of kind a snapshot does not have.
func (inst *instance) replaceRelated(kind int, snap []change[*relObj]) {
	x := inst.idx
	keep := make(map[objKey]bool, len(snap))
	for _, c := range snap {
		keep[c.key] = true
	}
	for ns, objs := range x.related[kind] {
		for name := range objs {
			if k := (objKey{ns, name}); !keep[k] {
				x.setRelated(kind, k, nil)
			}
		}
	}
}

// send hands u to the owner; false if ctx (the instance's, or a reader's
// own) ended meanwhile.
func (inst *instance) send(ctx context.Context, u update) bool {
	select {
	case inst.in <- u:
		return true
	case <-ctx.Done():
		return false
	}
}

// readPods reads the shared pod subscription.
func (inst *instance) readPods() {
	defer inst.wg.Done()
	ev, err := inst.opts.Subscribe(inst.ctx, cache.Request{GVR: podsGVR, Holder: inst.opts.Holder, Owner: cache.OwnerInternal})
	if err != nil {
		inst.fail(fmt.Errorf("address: watching pods: %w", err))
		return
	}
	defer ev.Close()
	err = read(inst.ctx, ev, func(o *cache.Object) *Pod {
		p, err := decodePod(o)
		if err != nil {
			inst.log.Warn("address: pod ignored", "pod", keyString(keyOf(o)), "err", err)
		}
		return p
	}, func(replace bool, cs []change[*Pod]) bool {
		return inst.send(inst.ctx, update{kind: podKind, replace: replace, pods: cs})
	})
	inst.fail(fmt.Errorf("address: watching pods: %w", err))
}

// readKind reads the subscription of a kind other than pods (of resource
// gvr) until ctx ends, handing its changes to the owner (set puts them in
// an update). While the resource is not served, the kind has no objects.
// While it cannot be read otherwise (the daemon may not list it, say), it
// has none either and answers name it Unavailable, with the cause, until a
// retry reads it: nothing else of the answers depends on it.
func readKind[T comparable](inst *instance, ctx context.Context, kind, gen int, gvr schema.GroupVersionResource, decode func(*cache.Object) T, set func(*update, []change[T])) {
	defer inst.wg.Done()
	emit := func(replace bool, cs []change[T]) bool {
		u := update{kind: kind, gen: gen, replace: replace}
		set(&u, cs)
		return inst.send(ctx, u)
	}
	wait := false // the first try is a plain subscription; later ones wait for a resource not served
	retry := backoff.Backoff{Initial: minRewatch, Max: maxRewatch}
	missing := ""
	for ctx.Err() == nil {
		ev, err := inst.opts.Subscribe(ctx, cache.Request{GVR: gvr, Holder: inst.opts.Holder, Owner: cache.OwnerInternal, WaitForResource: wait})
		if err == nil {
			retry.Reset()
			if missing != "" {
				inst.log.Info("address: kind readable again", "resource", gvr.String())
				missing = ""
			}
			err = read(ctx, ev, decode, emit)
			ev.Close()
		}
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, cache.ErrUnknownResource), errors.Is(err, cache.ErrResourceRemoved):
			// Not served (any more): no objects, until it is.
			if !emit(true, nil) {
				return
			}
			inst.log.Info("address: resource not served; waiting for it", "resource", gvr.String(), "err", err)
			if wait && retry.Wait(ctx) != nil {
				return
			}
			wait = true
		default:
			reason := err.Error()
			if !inst.send(ctx, update{kind: kind, gen: gen, replace: true, missing: reason}) {
				return
			}
			if reason != missing {
				inst.log.Warn("address: kind unavailable; answers name it, and it is retried", "resource", gvr.String(), "err", err)
				missing = reason
			}
			if retry.Wait(ctx) != nil {
				return
			}
			wait = false
		}
	}
}

// fail hands a reader's terminal error to the owner, unless the instance
// is stopping.
func (inst *instance) fail(err error) {
	if inst.ctx.Err() == nil {
		inst.send(inst.ctx, update{err: err})
	}
}

// read reads ev until it fails, decoding objects (decode returns nil for
// an object that is gone or no answer) and emitting changes in order: a
// snapshot (the first, or one after a Reset) as one replacing batch when
// its Synced marker arrives, then each batch of changes. It returns the
// error that ended ev, or ctx.Err() when emit refused.
func read[T comparable](ctx context.Context, ev Events, decode func(*cache.Object) T, emit func(replace bool, cs []change[T]) bool) error {
	var snap []change[T]
	inSnapshot := true
	for {
		evs, err := ev.Next(ctx, batchSize)
		if err != nil {
			return err
		}
		var cs []change[T]
		flush := func() bool {
			ok := len(cs) == 0 || emit(false, cs)
			cs = nil
			return ok
		}
		for _, e := range evs {
			switch e.Type {
			case cache.Reset:
				if !flush() {
					return ctx.Err()
				}
				snap, inSnapshot = nil, true
			case cache.Synced:
				if inSnapshot {
					if !emit(true, snap) {
						return ctx.Err()
					}
					snap, inSnapshot = nil, false
				}
			case cache.Added, cache.Modified, cache.Deleted:
				c := change[T]{key: keyOf(e.Object)}
				if e.Type != cache.Deleted {
					c.obj = decode(e.Object)
				}
				if inSnapshot {
					var zero T
					if c.obj != zero {
						snap = append(snap, c)
					}
				} else {
					cs = append(cs, c)
				}
			}
		}
		if !flush() {
			return ctx.Err()
		}
	}
}

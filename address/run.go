package address

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/internal/backoff"
)

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// podKind is the kind of an update that carries pods; related kinds are
// numbered from 0 in the order of Options.Related.
const podKind = -1

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

	mu  sync.Mutex // guards idx, err and unsynced
	idx *index
	// err is set when the instance can answer no more.
	err error
	// unsynced are the kinds not read in full yet: podKind and each
	// related kind.
	unsynced map[int]bool
}

// update is what a reader hands the owner: a batch of changes of one kind
// or the error that stopped the reader.
type update struct {
	kind int
	// replace says that the changes are the kind's whole set: a snapshot.
	replace bool
	pods    []change[*Pod]
	related []change[*relObj]
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
		go inst.readRelated(i)
	}
	return inst
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

func (inst *instance) add(addr netip.AddrPort) *entry {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return inst.idx.add(addr, inst.err)
}

func (inst *instance) remove(e *entry) {
	inst.mu.Lock()
	defer inst.mu.Unlock()
	inst.idx.remove(e)
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

// send hands u to the owner; false if the instance stopped meanwhile.
func (inst *instance) send(u update) bool {
	select {
	case inst.in <- u:
		return true
	case <-inst.ctx.Done():
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
		return inst.send(update{kind: podKind, replace: replace, pods: cs})
	})
	inst.fail(fmt.Errorf("address: watching pods: %w", err))
}

// readRelated reads the subscription of related kind i. While its
// resource is not served, the kind has no objects.
func (inst *instance) readRelated(i int) {
	defer inst.wg.Done()
	kind := &inst.opts.Related[i]
	emit := func(replace bool, cs []change[*relObj]) bool {
		return inst.send(update{kind: i, replace: replace, related: cs})
	}
	wait := false // the first try is a plain subscription; later ones wait for the resource
	retry := backoff.Backoff{Initial: minRewatch, Max: maxRewatch}
	for inst.ctx.Err() == nil {
		ev, err := inst.opts.Subscribe(inst.ctx, cache.Request{GVR: kind.Resource, Holder: inst.opts.Holder, Owner: cache.OwnerInternal, WaitForResource: wait})
		if err == nil {
			retry.Reset()
			err = read(inst.ctx, ev, func(o *cache.Object) *relObj {
				r, err := kind.decode(o)
				if err != nil {
					inst.log.Warn("address: related object selects nothing", "resource", kind.Resource.String(), "object", keyString(keyOf(o)), "err", err)
				}
				return r
			}, emit)
			ev.Close()
		}
		switch {
		case inst.ctx.Err() != nil:
			return
		case errors.Is(err, cache.ErrUnknownResource), errors.Is(err, cache.ErrResourceRemoved):
			// Not served (any more): no objects, until it is.
			if !emit(true, nil) {
				return
			}
			inst.log.Info("address: related resource not served; waiting for it", "resource", kind.Resource.String(), "err", err)
			if wait && retry.Wait(inst.ctx) != nil {
				return
			}
			wait = true
		default:
			inst.fail(fmt.Errorf("address: watching %s: %w", kind.Resource, err))
			return
		}
	}
}

// fail hands a reader's terminal error to the owner, unless the instance
// is stopping.
func (inst *instance) fail(err error) {
	if inst.ctx.Err() == nil {
		inst.send(update{err: err})
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

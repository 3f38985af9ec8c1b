package client

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// Handler receives the changes a Watch sees. Calls are sequential, in the
// order the API server made the changes. Objects handed to a handler are
// never modified by the library afterwards; handlers must not modify them
// either (the store keeps them).
type Handler interface {
	OnAdd(obj *unstructured.Unstructured)
	OnUpdate(oldObj, newObj *unstructured.Unstructured)
	OnDelete(obj *unstructured.Unstructured)
	// OnSynced is called once, after the first snapshot has been handed to
	// OnAdd: from then on the store holds everything that exists.
	OnSynced()
}

// HandlerFuncs adapts functions to a Handler; nil functions are skipped.
type HandlerFuncs struct {
	AddFunc    func(obj *unstructured.Unstructured)
	UpdateFunc func(oldObj, newObj *unstructured.Unstructured)
	DeleteFunc func(obj *unstructured.Unstructured)
	SyncedFunc func()
}

var _ Handler = HandlerFuncs{}

func (h HandlerFuncs) OnAdd(obj *unstructured.Unstructured) {
	if h.AddFunc != nil {
		h.AddFunc(obj)
	}
}

func (h HandlerFuncs) OnUpdate(oldObj, newObj *unstructured.Unstructured) {
	if h.UpdateFunc != nil {
		h.UpdateFunc(oldObj, newObj)
	}
}

func (h HandlerFuncs) OnDelete(obj *unstructured.Unstructured) {
	if h.DeleteFunc != nil {
		h.DeleteFunc(obj)
	}
}

func (h HandlerFuncs) OnSynced() {
	if h.SyncedFunc != nil {
		h.SyncedFunc()
	}
}

// Backoff bounds the jittered exponential backoff between reconnects.
type Backoff struct {
	// Initial is the first delay. Default 100ms.
	Initial time.Duration
	// Max caps the delay. Default 10s.
	Max time.Duration
}

// Watcher is a resilient watch: it reconnects with jittered backoff,
// resumes from the last resourceVersion it delivered, and keeps a local
// store so that a snapshot after a RESET or a daemon restart is turned into
// the real changes only. Create it with NewWatcher; Run it once.
type Watcher struct {
	c       *Client
	opts    WatchOptions
	h       Handler
	backoff Backoff

	// Owned by Run's goroutine:
	store  map[string]*unstructured.Unstructured
	resume string // "" until the first snapshot completes
	synced bool   // OnSynced was called

	// OnError, if set before Run, is called with every error that ends a
	// stream before Run reconnects (a terminal one is returned instead).
	OnError func(error)

	resets atomic.Int64
}

// Resets returns how many RESETs the Watcher has received: how often it
// had to diff a fresh snapshot against its store. Safe to call at any time.
func (w *Watcher) Resets() int64 { return w.resets.Load() }

// NewWatcher returns a Watcher of opts that calls h.
func NewWatcher(c *Client, opts WatchOptions, h Handler, b Backoff) *Watcher {
	if b.Initial <= 0 {
		b.Initial = 100 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 10 * time.Second
	}
	return &Watcher{c: c, opts: opts, h: h, backoff: b, store: map[string]*unstructured.Unstructured{}}
}

// terminal reports whether a stream error means retrying cannot help.
func terminal(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.PermissionDenied, codes.Unauthenticated,
		codes.Unimplemented, codes.FailedPrecondition:
		return true
	}
	return false
}

// Run watches until ctx ends (returning nil) or the daemon answers with an
// error that retrying cannot fix (returned as the gRPC status error).
func (w *Watcher) Run(ctx context.Context) error {
	delay := w.backoff.Initial
	for ctx.Err() == nil {
		progressed, err := w.runOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if terminal(err) {
			return err
		}
		if w.OnError != nil {
			w.OnError(err)
		}
		if progressed {
			delay = w.backoff.Initial
		}
		t := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		delay = min(2*delay, w.backoff.Max)
	}
	return nil
}

// runOnce runs one stream; progressed reports whether it delivered events.
func (w *Watcher) runOnce(ctx context.Context) (progressed bool, err error) {
	s, err := w.c.Stream(ctx, w.opts, w.resume)
	if err != nil {
		return false, err
	}
	defer s.Close()
	// Without a resume point the stream starts with a snapshot, which
	// replaces the store as a RESET does.
	var snap map[string]*unstructured.Unstructured
	if w.resume == "" {
		snap = map[string]*unstructured.Unstructured{}
	}
	for {
		evs, err := s.Recv()
		if err != nil {
			return progressed, err
		}
		progressed = true
		for _, ev := range evs {
			if snap, err = w.apply(ev, snap); err != nil {
				return progressed, status.Error(codes.Internal, err.Error())
			}
		}
	}
}

// apply handles one event; snap is non-nil while a snapshot is being read.
func (w *Watcher) apply(ev *informerdv1.Event, snap map[string]*unstructured.Unstructured) (map[string]*unstructured.Unstructured, error) {
	switch ev.GetType() {
	case informerdv1.EventType_EVENT_TYPE_RESET:
		w.resets.Add(1)
		return map[string]*unstructured.Unstructured{}, nil
	case informerdv1.EventType_EVENT_TYPE_SYNCED:
		if snap != nil {
			w.replace(snap)
		}
		w.resume = ev.GetResourceVersion()
		if !w.synced {
			w.synced = true
			w.h.OnSynced()
		}
		return nil, nil
	case informerdv1.EventType_EVENT_TYPE_BOOKMARK:
		if snap == nil && ev.GetResourceVersion() != "" {
			w.resume = ev.GetResourceVersion()
		}
		return snap, nil
	}
	obj, err := decode(ev.GetObject())
	if err != nil {
		return snap, err
	}
	k := storeKey(obj)
	if snap != nil {
		if ev.GetType() != informerdv1.EventType_EVENT_TYPE_DELETED {
			snap[k] = obj
		}
		return snap, nil
	}
	switch ev.GetType() {
	case informerdv1.EventType_EVENT_TYPE_ADDED, informerdv1.EventType_EVENT_TYPE_MODIFIED:
		w.upsert(k, obj)
	case informerdv1.EventType_EVENT_TYPE_DELETED:
		if _, ok := w.store[k]; ok {
			delete(w.store, k)
			w.h.OnDelete(obj)
		}
	}
	if rv := ev.GetResourceVersion(); rv != "" {
		w.resume = rv
	}
	return nil, nil
}

// replace makes snap the store, handing only the differences to the
// handler: deletions first, then additions and updates.
func (w *Watcher) replace(snap map[string]*unstructured.Unstructured) {
	for k, old := range w.store {
		if _, ok := snap[k]; !ok {
			delete(w.store, k)
			w.h.OnDelete(old)
		}
	}
	for k, obj := range snap {
		w.upsert(k, obj)
	}
}

// upsert stores obj and tells the handler, unless the store already has
// that resourceVersion (a duplicate).
func (w *Watcher) upsert(k string, obj *unstructured.Unstructured) {
	old := w.store[k]
	switch {
	case old == nil:
		w.store[k] = obj
		w.h.OnAdd(obj)
	case old.GetResourceVersion() != obj.GetResourceVersion():
		w.store[k] = obj
		w.h.OnUpdate(old, obj)
	}
}

// decode decodes an object from the daemon into Unstructured: JSON
// directly, protobuf through client-go's scheme.
func decode(b []byte) (*unstructured.Unstructured, error) {
	if isProtobuf(b) {
		typed, err := decodeTyped(b)
		if err != nil {
			return nil, err
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
		if err != nil {
			return nil, fmt.Errorf("decoding object from informerd: %w", err)
		}
		u := &unstructured.Unstructured{Object: m}
		u.SetGroupVersionKind(typed.GetObjectKind().GroupVersionKind())
		return u, nil
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(b); err != nil {
		return nil, fmt.Errorf("decoding object from informerd: %w", err)
	}
	return obj, nil
}

// protobufMagic starts every object in the API server's protobuf encoding.
var protobufMagic = []byte("k8s\x00")

func isProtobuf(b []byte) bool { return bytes.HasPrefix(b, protobufMagic) }

// decodeTyped decodes a built-in type, in protobuf or JSON, with
// client-go's scheme, keeping its apiVersion and kind.
func decodeTyped(b []byte) (runtime.Object, error) {
	obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(b, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding object from informerd: %w", err)
	}
	obj.GetObjectKind().SetGroupVersionKind(*gvk)
	return obj, nil
}

func storeKey(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return ns + "/" + obj.GetName()
	}
	return obj.GetName()
}

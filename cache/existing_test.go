package cache

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestManagerExistingInformerOnly: a request that asks for an existing
// informer only is served by one that runs or lingers for its Key, and
// otherwise fails with ErrNoInformer, starting nothing.
func TestManagerExistingInformerOnly(t *testing.T) {
	m, _, made := newTestManager(t, Options{LingerTTL: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := Request{GVR: testGVR, FieldSelector: "metadata.name=a", Holder: "h", Owner: "test", ExistingInformerOnly: true}
	if _, err := m.Subscribe(ctx, req); !errors.Is(err, ErrNoInformer) {
		t.Fatalf("with no informer: %v, want ErrNoInformer", err)
	}
	if made.Load() != 0 || len(m.Sources()) != 0 {
		t.Fatalf("with no informer: %d upstreams made, %d Sources, want none", made.Load(), len(m.Sources()))
	}
	// One started by a request that may start one (a watch), then left to linger.
	started := req
	started.ExistingInformerOnly = false
	s, err := m.Subscribe(ctx, started)
	if err != nil {
		t.Fatal(err)
	}
	if !s.StartedSource() {
		t.Error("the subscription that started the Source: StartedSource false")
	}
	s.Close()
	s, err = m.Subscribe(ctx, req)
	if err != nil {
		t.Fatalf("with a lingering informer: %v", err)
	}
	defer s.Close()
	if s.StartedSource() {
		t.Error("a subscription to a lingering Source: StartedSource true")
	}
	if made.Load() != 1 {
		t.Fatalf("%d upstreams made, want the one", made.Load())
	}
	// Another Key: none.
	other := req
	other.FieldSelector = "metadata.name=b"
	if _, err := m.Subscribe(ctx, other); !errors.Is(err, ErrNoInformer) || made.Load() != 1 {
		t.Fatalf("another key: %v with %d upstreams, want ErrNoInformer and no new one", err, made.Load())
	}
}

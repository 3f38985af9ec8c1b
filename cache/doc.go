// Package cache holds informerd's shared informers: one upstream list+watch
// (a Source) per Key, reference counted by a Manager, each with an ordered,
// bounded log of recent events and a store of current objects, both kept as
// encoded bytes.
//
// A Subscription is a cursor into one Source's log plus a filter
// (namespace, label selector). It reads a snapshot (every matching object,
// then a Synced marker) followed by deltas, in the order the API server made
// them. A subscriber that falls behind reads from the log at its own pace;
// one that falls out of the log's window receives a compacted catch-up (the
// latest state of each object changed since its position, plus the
// deletions), or, past the tombstone horizon, a Reset and a fresh snapshot.
// Memory per subscriber is O(1) in the number of objects: nothing is queued
// per subscriber.
//
// Events are immutable and shared by every subscriber; Encoded memoizes a
// per-view encoding so that each event of the log is encoded once,
// whatever the number of streams that carry it. What is memoized costs
// memory only while the event is in the log: a snapshot or catch-up hands
// out copies of the stored events, encoded for each subscriber (for the
// full view a header: the object's bytes are shared).
//
// Memory per stored object is its bytes, allocated at their size, plus a
// few fixed records (the Object, its Event and state, two tree slots) and
// its name: its resourceVersion is a view of its bytes, and namespaces,
// label sets and the shapes of managedFields are shared through a bounded
// interner. managedFields are kept and served as the API server sent them
// (unless Options.StripManagedFields), but an object stores only what is
// its own of them, each entry's time and the keys that name its
// addresses: Object.Buffers puts the shared rest back, without a copy.
// The Go benchmark BenchmarkHeapPerStoredObject measures it, against the
// bytes of the objects without managedFields; docs/benchmarks.md has the
// figures.
//
// Label selectors are always applied here, never upstream: a subscription
// with a label selector reads the Source of its resource and namespace, so
// that any number of selectors costs one upstream watch. Field selectors are
// part of the Key (the API server evaluates them).
//
// This package imports no gRPC; package daemon translates.
package cache

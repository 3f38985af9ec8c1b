package wrapconfig

import (
	"container/list"
	"sync"
	"time"
)

// ttlCache keeps values for ttl each, bounded by their bytes together:
// when over, the least recently used go first, and a value alone over the
// bound is not kept. Expired values are dropped as the cache is used; it
// starts no timer. Safe for concurrent use.
type ttlCache[K comparable, V any] struct {
	ttl      time.Duration
	maxBytes int64

	mu      sync.Mutex // guards the fields below
	entries map[K]*list.Element
	order   *list.List // of *ttlEntry[K, V], least recently used at the back
	bytes   int64
}

type ttlEntry[K comparable, V any] struct {
	key     K
	v       V
	bytes   int64
	expires time.Time
}

func newTTLCache[K comparable, V any](ttl time.Duration, maxBytes int64) *ttlCache[K, V] {
	return &ttlCache[K, V]{ttl: ttl, maxBytes: maxBytes, entries: map[K]*list.Element{}, order: list.New()}
}

// add keeps v, of the given bytes, for k (replacing what k had).
func (c *ttlCache[K, V]) add(k K, v V, bytes int64, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[k]; ok {
		c.remove(e)
	}
	if bytes > c.maxBytes {
		return
	}
	c.entries[k] = c.order.PushFront(&ttlEntry[K, V]{key: k, v: v, bytes: bytes, expires: now.Add(c.ttl)})
	c.bytes += bytes
	for c.bytes > c.maxBytes || c.expired(c.order.Back(), now) {
		c.remove(c.order.Back())
	}
}

// get returns the value of k, if kept.
func (c *ttlCache[K, V]) get(k K, now time.Time) (V, bool) {
	return c.lookup(k, now, false)
}

// take returns the value of k, if kept, and drops it.
func (c *ttlCache[K, V]) take(k K, now time.Time) (V, bool) {
	return c.lookup(k, now, true)
}

func (c *ttlCache[K, V]) lookup(k K, now time.Time, take bool) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var zero V
	e, ok := c.entries[k]
	if !ok {
		return zero, false
	}
	if c.expired(e, now) || take {
		v := c.remove(e)
		if !take {
			return zero, false
		}
		return v, true
	}
	c.order.MoveToFront(e)
	return e.Value.(*ttlEntry[K, V]).v, true
}

// expired reports whether e is past its TTL; false for nil. c.mu held.
func (c *ttlCache[K, V]) expired(e *list.Element, now time.Time) bool {
	return e != nil && !now.Before(e.Value.(*ttlEntry[K, V]).expires)
}

// remove drops e and returns its value; c.mu held.
func (c *ttlCache[K, V]) remove(e *list.Element) V {
	te := c.order.Remove(e).(*ttlEntry[K, V])
	delete(c.entries, te.key)
	c.bytes -= te.bytes
	return te.v
}

package wrapconfig

import (
	"testing"
	"time"
)

// TestTTLCache: values expire after the TTL, take removes, and the bytes
// stay within the bound, dropping the least recently used.
func TestTTLCache(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newTTLCache[string, int](time.Minute, 10)
	c.add("a", 1, 4, now)
	c.add("b", 2, 4, now)
	if v, ok := c.get("a", now); !ok || v != 1 { // a is now the most recently used
		t.Fatalf("get a = %v, %v", v, ok)
	}
	c.add("c", 3, 4, now) // over 10: b goes
	if _, ok := c.get("b", now); ok {
		t.Error("b kept past the byte bound")
	}
	if _, ok := c.get("a", now); !ok {
		t.Error("a, recently used, dropped")
	}
	c.add("big", 4, 11, now)
	if _, ok := c.get("big", now); ok {
		t.Error("a value alone over the bound kept")
	}
	if v, ok := c.take("c", now); !ok || v != 3 {
		t.Fatalf("take c = %v, %v", v, ok)
	}
	if _, ok := c.get("c", now); ok {
		t.Error("c kept after take")
	}
	if _, ok := c.get("a", now.Add(time.Minute)); ok {
		t.Error("a kept past its TTL")
	}
	if c.bytes != 0 || len(c.entries) != 0 || c.order.Len() != 0 {
		t.Errorf("after all went: %d bytes, %d entries, %d in order", c.bytes, len(c.entries), c.order.Len())
	}
}

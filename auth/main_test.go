package auth

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// golang-lru/v2's expirable LRU never stops its expiry goroutine.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"))
}

package auth

import (
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// golang-lru/v2's expirable LRU never stops its expiry goroutine.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"))
}

// concurrently runs f in n goroutines that all start before release is
// closed (which f's review waits for), and fails the test on any error.
func concurrently(t *testing.T, n int, release chan struct{}, f func() error) {
	t.Helper()
	var started, done sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			started.Done()
			errs <- f()
		}()
	}
	started.Wait()
	close(release)
	done.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

package statuswatcher_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if a Watch's goroutine, or the fake daemon's,
// outlives them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

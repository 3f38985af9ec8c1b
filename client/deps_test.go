package client

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDependencies: a program that only needs a Watcher links neither
// Prometheus nor controller-runtime (cli-utils' StatusWatcher brings both:
// it lives in client/statuswatcher) nor wrapconfig's HTTP emulation.
func TestDependencies(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go command is not in PATH (%v): cannot list the package's dependencies", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, goCmd, "list", "-deps", ".").Output()
	if err != nil {
		var stderr string
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps: %v\n%s", err, stderr)
	}
	forbidden := []string{"github.com/prometheus/", "sigs.k8s.io/controller-runtime", "github.com/informerd/informerd/client/wrapconfig"}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.Contains(dep, f) {
				t.Errorf("package client depends on %s, which every program using it links", dep)
			}
		}
	}
}

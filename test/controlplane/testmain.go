package controlplane

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// KubeconfigEnv names a kubeconfig of a running throwaway cluster (such as
// `make cluster-up` writes) for e2e tests to reuse instead of starting their
// own. It is deliberately not KUBECONFIG: tests create and delete objects
// and must never run against a cluster by accident.
const KubeconfigEnv = "INFORMERD_E2E_KUBECONFIG"

// Main is the body of an e2e package's TestMain: it attaches to the cluster
// named by $INFORMERD_E2E_KUBECONFIG or starts one with opts, stores it in
// *cp, runs the tests, prints the control-plane logs if they failed, and
// stops what it started. It returns the exit code for os.Exit.
func Main(m *testing.M, opts Options, cp **ControlPlane) int {
	var err error
	if path := os.Getenv(KubeconfigEnv); path != "" {
		*cp, err = Attach(path)
	} else {
		opts.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "controlplane: "+format+"\n", args...) }
		*cp, err = Start(context.Background(), opts)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: control plane:", err)
		return 1
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, (*cp).Logs(16<<10))
	}
	(*cp).Stop()
	return code
}

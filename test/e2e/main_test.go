// Package e2e tests informerd against a real kube-apiserver and etcd (plus
// kube-controller-manager, kube-scheduler and a kwok fake node), started
// once per test binary by the controlplane package.
package e2e

import (
	"flag"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/informerd/informerd/test/controlplane"
)

// env is the control plane every test in this package uses.
var env *controlplane.ControlPlane

func TestMain(m *testing.M) {
	// go test -list only names the tests (hack/test.sh shards them by
	// name): no control plane, no builds.
	if flag.Parse(); flag.Lookup("test.list").Value.String() != "" {
		os.Exit(m.Run())
	}
	audit, err := startAuditLog()
	if err != nil {
		os.Stderr.WriteString("e2e: " + err.Error() + "\n")
		os.Exit(1)
	}
	built := make(chan struct{})
	go func() { defer close(built); prebuild() }()
	code := controlplane.Main(m, controlplane.Options{ControllerManager: true, FakeNode: true, APIServerFlags: audit.flags}, &env)
	audit.remove()
	<-built
	if code == 0 {
		if err := goleak.Find(goleakOptions...); err != nil {
			os.Stderr.WriteString("e2e: leaked goroutines: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

// goleakOptions ignore the background goroutines client-go starts once per
// process and never stops.
var goleakOptions = []goleak.Option{
	goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*Type).updateUnfinishedWorkLoop"),
	goleak.IgnoreAnyFunction("k8s.io/client-go/util/workqueue.(*delayingType).waitingLoop"),
	goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	// golang-lru/v2's expirable LRU never stops its expiry goroutine (one per cache.Manager).
	goleak.IgnoreAnyFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"),
}

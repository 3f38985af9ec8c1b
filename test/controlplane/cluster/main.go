// Command cluster starts or stops a detached local control plane for manual
// use and the demo: `cluster up` prints the kubeconfig path on success,
// `cluster down` stops what `up` started in the same directory.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/informerd/informerd/test/controlplane"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 || (args[0] != "up" && args[0] != "down") {
		return fmt.Errorf("usage: cluster up|down [flags]")
	}
	fs := flag.NewFlagSet("cluster "+args[0], flag.ContinueOnError)
	dir := fs.String("dir", "_output/cluster", "directory for PKI, etcd data, logs and the kubeconfig")
	var o controlplane.Options
	fs.IntVar(&o.APIServerPort, "apiserver-port", 0, "kube-apiserver secure port (0: a free port)")
	fs.IntVar(&o.EtcdPort, "etcd-port", 0, "etcd client port (0: a free port)")
	fs.IntVar(&o.EtcdPeerPort, "etcd-peer-port", 0, "etcd peer port (0: a free port)")
	fs.BoolVar(&o.ControllerManager, "controller-manager", true, "start kube-controller-manager")
	fs.BoolVar(&o.FakeNode, "fake-node", true, "start kube-scheduler and kwok with one fake node")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if args[0] == "down" {
		if err := controlplane.Down(*dir); err != nil {
			return err
		}
		return os.RemoveAll(*dir)
	}
	if err := controlplane.Down(*dir); err != nil { // a previous `up` in the same place
		return err
	}
	if err := os.RemoveAll(*dir); err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	o.Dir, o.Detach = *dir, true
	o.Logf = func(format string, a ...any) { fmt.Fprintf(os.Stderr, "cluster: "+format+"\n", a...) }
	cp, err := controlplane.Start(ctx, o)
	if err != nil {
		return err
	}
	fmt.Println(cp.KubeconfigPath)
	return nil
}

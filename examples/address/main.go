// Command address asks informerd who is behind an ip:port (a pod, by its
// IP or by its node's IP and hostPort), as a data-plane proxy does for
// each connection, and prints each answer as it changes; without -follow
// it exits after the first (docs/adoption.md, docs/address.md).
//
//	address -target 10.244.0.7:8080 [-address ...] [-token-file ...] [-follow]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

func main() {
	address := flag.String("address", client.DefaultSocket, "informerd's socket")
	tokenFile := flag.String("token-file", client.DefaultTokenFile, "a ServiceAccount token with audience informerd")
	target := flag.String("target", "", "the IP:port to ask about")
	follow := flag.Bool("follow", false, "print every change until interrupted")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *address, *tokenFile, *target, *follow); err != nil {
		fmt.Fprintln(os.Stderr, "address:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, address, tokenFile, target string, follow bool) error {
	addr, err := netip.ParseAddrPort(target)
	if err != nil {
		return fmt.Errorf("-target %q: %w", target, err)
	}
	c, err := client.Dial(address, client.WithTokenFile(tokenFile))
	if err != nil {
		return err
	}
	defer c.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := client.NewAddressWatcher(c, client.AddressOptions{Address: addr, ClientName: "example-address"}, func(a *informerdv1.WatchAddressResponse) {
		fmt.Println(describe(a))
		if !follow {
			cancel()
		}
	}, client.AddressWatcherOptions{})
	if err := w.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// describe is one line: the pod behind the address, or that there is none.
func describe(a *informerdv1.WatchAddressResponse) string {
	p := a.GetPod()
	if p == nil {
		return "no pod behind " + a.String()
	}
	return fmt.Sprintf("pod %s/%s ready=%t", p.GetNamespace(), p.GetName(), p.GetReady())
}

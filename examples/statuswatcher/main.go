// Command statuswatcher prints the kstatus of a Deployment as cli-utils'
// StatusWatcher reports it, computed by informerd (WatchStatus): the one
// change for an applier is the StatusWatcher it is built with
// (docs/adoption.md):
//
//	apply.NewApplierBuilder().WithStatusWatcher(statuswatcher.New(c, statuswatcher.Options{})).
//
// It prints each status until the Deployment is Current (or, with
// -until-sync, until the first statuses are in).
//
//	statuswatcher -namespace default -deployment web [-address ...] [-token-file ...]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/statuswatcher"
)

func main() {
	address := flag.String("address", client.DefaultSocket, "informerd's socket")
	tokenFile := flag.String("token-file", client.DefaultTokenFile, "a ServiceAccount token with audience informerd")
	namespace := flag.String("namespace", "default", "the Deployment's namespace")
	name := flag.String("deployment", "", "the Deployment's name")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *address, *tokenFile, *namespace, *name); err != nil {
		fmt.Fprintln(os.Stderr, "statuswatcher:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, address, tokenFile, namespace, name string) error {
	if name == "" {
		return fmt.Errorf("-deployment is required")
	}
	c, err := client.Dial(address, client.WithTokenFile(tokenFile))
	if err != nil {
		return err
	}
	defer c.Close()

	// A watcher.StatusWatcher. Direct: watcher.NewDefaultStatusWatcher(dynamicClient, restMapper)
	w := statuswatcher.New(c, statuswatcher.Options{ClientName: "example-statuswatcher"})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	id := object.ObjMetadata{GroupKind: schema.GroupKind{Group: "apps", Kind: "Deployment"}, Namespace: namespace, Name: name}
	for ev := range w.Watch(ctx, object.ObjMetadataSet{id}, watcher.Options{}) {
		switch ev.Type {
		case event.ErrorEvent:
			return ev.Error
		case event.SyncEvent:
			fmt.Println("synced")
		case event.ResourceUpdateEvent:
			fmt.Printf("deployment %s/%s %s: %s\n", namespace, name, ev.Resource.Status, ev.Resource.Message)
			if ev.Resource.Status == kstatus.CurrentStatus {
				return nil
			}
		}
	}
	return fmt.Errorf("stopped before the Deployment was Current: %w", context.Cause(ctx))
}

// Command listerwatcher is a client-go SharedIndexInformer of ConfigMaps
// whose list and watch informerd serves: the one change from a direct
// informer is the ListerWatcher (docs/adoption.md). It prints each
// ConfigMap once the informer has synced, then, with -follow, each change.
//
//	listerwatcher -namespace default [-address /var/run/informerd/informerd.sock] [-token-file ...] [-follow]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/client"
)

func main() {
	address := flag.String("address", client.DefaultSocket, "informerd's socket")
	tokenFile := flag.String("token-file", client.DefaultTokenFile, "a ServiceAccount token with audience informerd")
	namespace := flag.String("namespace", "default", "namespace to watch")
	follow := flag.Bool("follow", false, "print changes after the initial state until interrupted")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *address, *tokenFile, *namespace, *follow); err != nil {
		fmt.Fprintln(os.Stderr, "listerwatcher:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, address, tokenFile, namespace string, follow bool) error {
	c, err := client.Dial(address, client.WithTokenFile(tokenFile))
	if err != nil {
		return err
	}
	defer c.Close()

	// Direct: cache.NewListWatchFromClient(kube.CoreV1().RESTClient(), "configmaps", namespace, fields.Everything())
	lw := client.NewListerWatcher(c, client.WatchOptions{Resource: corev1.SchemeGroupVersion.WithResource("configmaps"), Namespace: namespace, Protobuf: true})
	informer := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})

	var synced atomic.Bool // the initial state is printed from the store
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if synced.Load() {
				fmt.Println("added", key(obj))
			}
		},
		UpdateFunc: func(_, obj any) { fmt.Println("updated", key(obj)) },
		DeleteFunc: func(obj any) { fmt.Println("deleted", key(obj)) },
	}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	var running sync.WaitGroup
	running.Add(1)
	go func() { defer running.Done(); informer.RunWithContext(ctx) }() // ends with ctx
	defer func() { cancel(); running.Wait() }()
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return fmt.Errorf("not synced: %w", context.Cause(ctx))
	}
	for _, k := range informer.GetStore().ListKeys() {
		fmt.Println("configmap", k)
	}
	fmt.Printf("synced %d configmaps\n", len(informer.GetStore().ListKeys()))
	if !follow {
		return nil
	}
	synced.Store(true)
	<-ctx.Done()
	return nil
}

func key(obj any) string {
	k, _ := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	return k
}

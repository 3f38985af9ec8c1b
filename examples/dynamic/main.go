// Command dynamic reads ConfigMaps with a dynamic.Interface and a
// dynamicinformer factory whose reads informerd serves: the one change
// from the direct form is the dynamic client (docs/adoption.md). Writes
// would go to the real client given to NewDynamicClient (here none: they
// fail with 405 Method Not Allowed).
//
//	dynamic -namespace default [-address ...] [-token-file ...]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/client"
)

var configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

func main() {
	address := flag.String("address", client.DefaultSocket, "informerd's socket")
	tokenFile := flag.String("token-file", client.DefaultTokenFile, "a ServiceAccount token with audience informerd")
	namespace := flag.String("namespace", "default", "namespace to read")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *address, *tokenFile, *namespace); err != nil {
		fmt.Fprintln(os.Stderr, "dynamic:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, address, tokenFile, namespace string) error {
	c, err := client.Dial(address, client.WithTokenFile(tokenFile))
	if err != nil {
		return err
	}
	defer c.Close()

	// Direct: dyn, err := dynamic.NewForConfig(restConfig)
	dyn := client.NewDynamicClient(c, "example-dynamic", nil)

	// A List, as with the API server.
	list, err := dyn.Resource(configMaps).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	fmt.Printf("listed %d configmaps\n", len(list.Items))

	// The dynamic informers of client-go, unchanged.
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, namespace, nil)
	informer := factory.ForResource(configMaps)
	ctx, cancel := context.WithCancel(ctx)
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }()
	if !cache.WaitForCacheSync(ctx.Done(), informer.Informer().HasSynced) {
		return fmt.Errorf("not synced: %w", context.Cause(ctx))
	}
	objs, err := informer.Lister().List(labels.Everything())
	if err != nil {
		return err
	}
	for _, o := range objs {
		k, _ := cache.MetaNamespaceKeyFunc(o)
		fmt.Println("configmap", k)
	}
	fmt.Printf("synced %d configmaps\n", len(objs))
	return nil
}

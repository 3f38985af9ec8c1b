// Command factory lists Pods and ConfigMaps through typed informers of
// client.NewInformerFactory, which stands where client-go's
// informers.NewSharedInformerFactory stood: the one change
// (docs/adoption.md). Listers, handlers and HasSynced are client-go's.
//
//	factory -namespace default [-address ...] [-token-file ...]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/informerd/informerd/client"
)

func main() {
	address := flag.String("address", client.DefaultSocket, "informerd's socket")
	tokenFile := flag.String("token-file", client.DefaultTokenFile, "a ServiceAccount token with audience informerd")
	namespace := flag.String("namespace", "default", "namespace to read")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *address, *tokenFile, *namespace); err != nil {
		fmt.Fprintln(os.Stderr, "factory:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, address, tokenFile, namespace string) error {
	c, err := client.Dial(address, client.WithTokenFile(tokenFile))
	if err != nil {
		return err
	}
	defer c.Close()

	// Direct: factory := informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(namespace))
	factory := client.NewInformerFactory(c, client.FactoryOptions{Namespace: namespace, Protobuf: true, ClientName: "example-factory"})

	pods, err := factory.InformerFor(&corev1.Pod{})
	if err != nil {
		return err
	}
	configMaps, err := factory.InformerFor(&corev1.ConfigMap{})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	factory.Start(ctx)
	defer func() { cancel(); factory.Shutdown() }()
	if !factory.WaitForCacheSync(ctx) {
		return fmt.Errorf("not synced: %w", context.Cause(ctx))
	}
	podList, err := corelisters.NewPodLister(pods.GetIndexer()).Pods(namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	for _, p := range podList {
		fmt.Printf("pod %s/%s %s\n", p.Namespace, p.Name, p.Status.Phase)
	}
	cms, err := corelisters.NewConfigMapLister(configMaps.GetIndexer()).ConfigMaps(namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	for _, cm := range cms {
		fmt.Printf("configmap %s/%s\n", cm.Namespace, cm.Name)
	}
	fmt.Printf("synced %d pods, %d configmaps\n", len(podList), len(cms))
	return nil
}

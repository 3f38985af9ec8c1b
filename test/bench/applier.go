package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	cmdutil "k8s.io/kubectl/pkg/cmd/util"
	"sigs.k8s.io/cli-utils/pkg/apply"
	applyevent "sigs.k8s.io/cli-utils/pkg/apply/event"
	"sigs.k8s.io/cli-utils/pkg/common"
	"sigs.k8s.io/cli-utils/pkg/inventory"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/statuswatcher"
)

// The applier modes of `bench status`: where an applier's StatusWatcher
// gets statuses from.
const (
	// applierApplyOnly applies without waiting (cli-utils'
	// BlindStatusWatcher): the baseline that the waiting modes add to.
	applierApplyOnly = "apply-only"
	applierDirect    = "direct"    // cli-utils' DefaultStatusWatcher, against the API server
	applierInformerd = "informerd" // statuswatcher.New: the daemon's WatchStatus
	// applierInformerdMapper also maps kinds with client.NewRESTMapper
	// (the daemon's discovery) instead of the kubectl factory's mapper.
	applierInformerdMapper = "informerd-mapper"
)

var applierModes = []string{applierApplyOnly, applierDirect, applierInformerd, applierInformerdMapper}

// applierResult is what one applier process reports on its stdout.
type applierResult struct {
	WallSeconds float64 `json:"wallSeconds"`
	// PeakRSS is the process's peak resident set (VmHWM).
	PeakRSS uint64 `json:"peakRSSBytes"`
	// TotalAlloc and Mallocs are the Go heap's cumulative allocations.
	TotalAlloc uint64   `json:"totalAllocBytes"`
	Mallocs    uint64   `json:"mallocs"`
	Applied    int      `json:"applied"`
	Reconciled int      `json:"reconciled"`
	Errors     []string `json:"errors,omitempty"`
}

// runApplier is the role of one applier process: a cli-utils Applier that
// applies -deployments Deployments of one replica into -namespace and
// waits until they are reconciled.
func runApplier(args []string) error {
	fs := flag.NewFlagSet("bench applier", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the control plane")
	mode := fs.String("mode", applierDirect, "apply-only, direct or informerd")
	socket := fs.String("socket", "", "informerd's socket (mode informerd)")
	tokenFile := fs.String("token-file", "", "the applier's ServiceAccount token for informerd's audience (mode informerd)")
	namespace := fs.String("namespace", "", "namespace to apply into")
	n := fs.Int("deployments", 100, "Deployments to apply")
	qps := fs.Float64("qps", 100, "the applier's client QPS (burst twice that), as a CLI would set it")
	timeout := fs.Duration("timeout", 20*time.Minute, "reconcile timeout")
	memProfile := fs.String("memprofile", "", "write an allocation profile here at the end")
	if err := fs.Parse(args); err != nil {
		return err
	}
	start := time.Now()
	flags := genericclioptions.NewConfigFlags(false)
	cacheDir, err := os.MkdirTemp("", "bench-applier-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(cacheDir)
	flags.KubeConfig, flags.CacheDir = kubeconfig, &cacheDir
	flags.WrapConfigFn = func(c *rest.Config) *rest.Config {
		c.QPS, c.Burst = float32(*qps), int(2**qps)
		return c
	}
	f := cmdutil.NewFactory(cmdutil.NewMatchVersionFlags(flags))
	inv, err := inventory.ClusterClientFactory{StatusPolicy: inventory.StatusPolicyAll}.NewClient(f)
	if err != nil {
		return err
	}
	b := apply.NewApplierBuilder().WithFactory(f).WithInventoryClient(inv)
	wait := *timeout
	switch *mode {
	case applierApplyOnly:
		// cli-utils always adds a wait task, and 0 means no timeout: a
		// nanosecond ends it at once (every object times out).
		b, wait = b.WithStatusWatcher(watcher.BlindStatusWatcher{}), time.Nanosecond
	case applierDirect:
	case applierInformerd, applierInformerdMapper:
		c, err := client.Dial(*socket, client.WithTokenFile(*tokenFile))
		if err != nil {
			return err
		}
		defer c.Close()
		b = b.WithStatusWatcher(statuswatcher.New(c, statuswatcher.Options{ClientName: "applier-" + *namespace}))
		if *mode == applierInformerdMapper {
			b = b.WithRestMapper(client.NewRESTMapper(c))
		}
	default:
		return fmt.Errorf("-mode %q: want one of %s", *mode, strings.Join(applierModes, ", "))
	}
	a, err := b.Build()
	if err != nil {
		return err
	}
	objs := make([]*unstructured.Unstructured, *n)
	for i := range objs {
		objs[i] = benchDeployment(*namespace, fmt.Sprintf("d-%05d", i))
	}
	invInfo := inventory.WrapInventoryInfoObj(&unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "inventory", "namespace": *namespace, "labels": map[string]any{common.InventoryLabel: *namespace}},
	}})
	var res applierResult
	for e := range a.Run(context.Background(), invInfo, objs, apply.ApplierOptions{ReconcileTimeout: wait}) {
		switch e.Type {
		case applyevent.ErrorType:
			res.Errors = append(res.Errors, e.ErrorEvent.Err.Error())
		case applyevent.ApplyType:
			if e.ApplyEvent.Error != nil {
				res.Errors = append(res.Errors, e.ApplyEvent.Error.Error())
			}
			if e.ApplyEvent.Status == applyevent.ApplySuccessful {
				res.Applied++
			}
		case applyevent.WaitType:
			switch e.WaitEvent.Status {
			case applyevent.ReconcileSuccessful:
				res.Reconciled++
			case applyevent.ReconcileTimeout, applyevent.ReconcileFailed:
				if *mode != applierApplyOnly {
					res.Errors = append(res.Errors, fmt.Sprintf("%s: %s", e.WaitEvent.Identifier, e.WaitEvent.Status))
				}
			}
		}
	}
	res.WallSeconds = time.Since(start).Seconds()
	if *memProfile != "" {
		if err := writeAllocs(*memProfile); err != nil {
			return err
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.TotalAlloc, res.Mallocs = ms.TotalAlloc, ms.Mallocs
	if res.PeakRSS, err = statusField("/proc/self/status", "VmHWM:"); err != nil {
		return err
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return err
	}
	if len(res.Errors) > 0 || res.Applied < *n || (*mode != applierApplyOnly && res.Reconciled < *n) {
		return errors.New("not every Deployment was applied and reconciled")
	}
	return nil
}

// benchDeployment is a Deployment of one replica whose Pod runs on the
// kwok node.
func benchDeployment(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"replicas": int64(1),
			"selector": map[string]any{"matchLabels": map[string]any{"app": name}},
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": name}},
				"spec":     map[string]any{"containers": []any{map[string]any{"name": "c", "image": "registry.invalid/none:1"}}},
			},
		},
	}}
}

func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("allocs").WriteTo(f, 0)
}

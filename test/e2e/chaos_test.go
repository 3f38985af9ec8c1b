package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/informerd/informerd/client"
)

// orderChecker is a recorder that also fails the test if its handler ever
// sees an object go back in resourceVersion or receive a state it had.
type orderChecker struct {
	*recorder
	t *testing.T
}

func (o orderChecker) OnUpdate(oldObj, newObj any) {
	old, obj := oldObj.(*unstructured.Unstructured), newObj.(*unstructured.Unstructured)
	a, _ := strconv.ParseUint(old.GetResourceVersion(), 10, 64)
	b, _ := strconv.ParseUint(obj.GetResourceVersion(), 10, 64)
	if b <= a {
		o.t.Errorf("%s/%s went from resourceVersion %d to %d", obj.GetNamespace(), obj.GetName(), a, b)
	}
	o.recorder.OnUpdate(old, obj)
}

// TestChaos mixes random mutations with random faults (network resets and
// black holes between daemon and API server, API server restarts, daemon
// kill -9 and graceful restarts) for a bounded time from a logged seed, then
// checks that every client converges on the API server's state and never
// saw an update out of order. INFORMERD_CHAOS_DURATION (default 40s) and
// INFORMERD_CHAOS_SEED set the run; `make chaos` runs a long one.
func TestChaos(t *testing.T) {
	if !env.Owned() {
		t.Skip("needs a control plane this test binary started")
	}
	duration := 40 * time.Second
	if v := os.Getenv("INFORMERD_CHAOS_DURATION"); v != "" {
		var err error
		if duration, err = time.ParseDuration(v); err != nil {
			t.Fatalf("INFORMERD_CHAOS_DURATION: %v", err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("INFORMERD_CHAOS_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("chaos seed %d (INFORMERD_CHAOS_SEED=%d repeats the sequence of choices), duration %s", seed, seed, duration)
	rng := rand.New(rand.NewPCG(seed, seed))
	ctx, cancel := context.WithTimeout(context.Background(), duration+3*time.Minute)
	defer cancel()

	ns := createNamespace(ctx, t, "chaos")
	proxy := newFaultProxy(t, env.APIServerURL[len("https://"):])
	kubeconfig := proxiedKubeconfig(t, "https://"+proxy.addr())
	d := startDaemonProcess(t, filepath.Join(t.TempDir(), "informerd.sock"),
		"-kubeconfig", kubeconfig, "-scope", "namespace", "-upstream-timeout", "3s", "-log-max-events", "200", "-log-min-age", "0s")
	recs, _ := startWatchers(ctx, t, d.socket, ns, 5)
	for i := range 3 { // and three whose handlers check the order of updates
		c, err := client.Dial(d.socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		r := newRecorder()
		runWatcher(t, c, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: fmt.Sprintf("ordered-%d", i)}, orderChecker{r, t})
		<-r.synced
		recs = append(recs, r)
	}

	// Mutations: a seeded stream of creates, updates and deletes of 30
	// objects; failures while the API server is down are expected.
	cms := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns)
	mutRNG := rand.New(rand.NewPCG(seed+1, seed+1))
	var mutations, failed int
	mctx, stopMutations := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // ends when stopMutations is called
		defer wg.Done()
		for mctx.Err() == nil {
			name := fmt.Sprintf("obj-%d", mutRNG.IntN(30))
			var err error
			switch mutRNG.IntN(4) {
			case 0:
				err = cms.Delete(mctx, name, metav1.DeleteOptions{})
			default:
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"n": strconv.Itoa(mutations)}}
				if _, err = cms.Update(mctx, cm, metav1.UpdateOptions{}); err != nil {
					_, err = cms.Create(mctx, cm, metav1.CreateOptions{})
				}
			}
			if err != nil {
				failed++
				hold(mctx, 50*time.Millisecond) // the API server may be away: do not spin
			} else {
				mutations++
			}
		}
	}()

	faults := map[string]int{}
	pause := func() { hold(ctx, time.Duration(500+rng.IntN(2500))*time.Millisecond) } // the chaos schedule itself
	for deadline := time.Now().Add(duration); time.Now().Before(deadline); pause() {
		switch f := rng.IntN(5); f {
		case 0:
			faults["network reset"]++
			proxy.Drop()
		case 1:
			faults["network black hole"]++
			proxy.Hang()
			hold(ctx, time.Duration(1+rng.IntN(5))*time.Second) // the length of the black hole
			proxy.Resume()
		case 2:
			faults["API server restart"]++
			env.StopAPIServer()
			startAPIServer(ctx, t)
		case 3:
			faults["daemon kill -9"]++
			d.signal(syscall.SIGKILL)
			d.start()
		case 4:
			faults["daemon graceful restart"]++
			d.signal(syscall.SIGTERM)
			d.start()
		}
	}
	stopMutations()
	wg.Wait()
	lastFault := time.Now()

	want := listState(ctx, t, configMaps, ns)
	divergences := 0
	for _, r := range recs {
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		for {
			objs, _, changed := r.snapshot()
			if maps.Equal(objs, want) {
				break
			}
			select {
			case <-changed:
				continue
			case <-cctx.Done():
				divergences++
			}
			break
		}
		ccancel()
		r.checkUnmutated(t)
	}
	t.Logf("chaos: %s; faults %v; %d mutations (%d refused while the API server was away); %d clients; %d divergences; converged %s after the last fault",
		duration, faults, mutations, failed, len(recs), divergences, time.Since(lastFault))
	if divergences != 0 {
		t.Fatalf("%d clients did not converge on the API server's state", divergences)
	}
}

// proxiedKubeconfig writes an admin kubeconfig whose server is addr (the
// TLS name stays 127.0.0.1, which the proxy also is).
func proxiedKubeconfig(t *testing.T, server string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(env.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = server
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

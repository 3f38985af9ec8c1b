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
	toolscache "k8s.io/client-go/tools/cache"
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
		c := dialSocket(t, d.socket, reads(configMaps, ns))
		r := newRecorder()
		runWatcher(t, c, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: fmt.Sprintf("ordered-%d", i)}, orderChecker{r, t})
		<-r.synced
		recs = append(recs, r)
	}

	// And client-go informers with a label selector, through the
	// ListerWatcher: they must converge on the selected objects and never
	// be told of the deletion of an object they never had.
	var selected []*selectorInformer
	for i := range 2 {
		selected = append(selected, runSelectorInformer(ctx, t, d.socket, ns, "parity=even", fmt.Sprintf("selected-%d", i)))
	}

	// Mutations: a seeded stream of creates, updates and deletes of 30
	// objects whose parity label flips at random, so that objects enter
	// and leave the selector; failures while the API server is down are
	// expected.
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
				parity := [2]string{"even", "odd"}[mutRNG.IntN(2)]
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"parity": parity}}, Data: map[string]string{"n": strconv.Itoa(mutations)}}
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
	wantSelected := listSelected(ctx, t, ns, "parity=even")
	neverSeen := 0
	for _, si := range selected {
		if !si.converge(ctx, wantSelected) {
			divergences++
		}
		neverSeen += si.neverSeenDeletes()
	}
	t.Logf("chaos: %s; faults %v; %d mutations (%d refused while the API server was away); %d clients (%d of them informers with a label selector); %d divergences; %d deletions of never-seen objects; converged %s after the last fault",
		duration, faults, mutations, failed, len(recs)+len(selected), len(selected), divergences, neverSeen, time.Since(lastFault))
	if divergences != 0 {
		t.Fatalf("%d clients did not converge on the API server's state", divergences)
	}
	if neverSeen != 0 {
		t.Fatalf("informers with a label selector were told of %d deletions of objects they never had", neverSeen)
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

// selectorInformer is a client-go informer with a label selector over the
// ListerWatcher, whose handler keeps the keys it was given and counts the
// deletions of keys it never had (client-go hands every DELETED to
// OnDelete, known or not).
type selectorInformer struct {
	inf toolscache.SharedIndexInformer

	mu        sync.Mutex // guards the fields below
	have      map[string]bool
	neverSeen int
	changed   chan struct{} // closed and replaced on every event
}

func runSelectorInformer(ctx context.Context, t *testing.T, socket, ns, selector, name string) *selectorInformer {
	t.Helper()
	c := dialSocket(t, socket, reads(configMaps, ns))
	lw := client.NewListerWatcher(c, client.WatchOptions{Resource: configMaps, Namespace: ns, LabelSelector: selector, ClientName: name})
	si := &selectorInformer{inf: toolscache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, toolscache.Indexers{}),
		have: map[string]bool{}, changed: make(chan struct{})}
	note := func(obj any, del bool) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		o := obj.(*unstructured.Unstructured)
		k := o.GetNamespace() + "/" + o.GetName()
		si.mu.Lock()
		defer si.mu.Unlock()
		switch {
		case !del:
			si.have[k] = true
		case !si.have[k]:
			si.neverSeen++
			t.Errorf("%s: OnDelete of %s, which it never had", name, k)
		default:
			delete(si.have, k)
		}
		close(si.changed)
		si.changed = make(chan struct{})
	}
	if _, err := si.inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { note(o, false) },
		UpdateFunc: func(_, o any) { note(o, false) },
		DeleteFunc: func(o any) { note(o, true) },
	}); err != nil {
		t.Fatal(err)
	}
	ictx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); si.inf.RunWithContext(ictx) }()
	t.Cleanup(func() { cancel(); <-done })
	if !toolscache.WaitForCacheSync(ctx.Done(), si.inf.HasSynced) {
		t.Fatalf("%s never synced", name)
	}
	return si
}

// state is the informer's store: key -> resourceVersion.
func (si *selectorInformer) state() (map[string]string, chan struct{}) {
	si.mu.Lock()
	ch := si.changed
	si.mu.Unlock()
	out := map[string]string{}
	for _, obj := range si.inf.GetStore().List() {
		o := obj.(*unstructured.Unstructured)
		out[o.GetNamespace()+"/"+o.GetName()] = o.GetResourceVersion()
	}
	return out, ch
}

// converge waits up to a minute for the store to equal want.
func (si *selectorInformer) converge(ctx context.Context, want map[string]string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		got, changed := si.state()
		if maps.Equal(got, want) {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

func (si *selectorInformer) neverSeenDeletes() int {
	si.mu.Lock()
	defer si.mu.Unlock()
	return si.neverSeen
}

// listSelected is the API server's view of a label selector's objects.
func listSelected(ctx context.Context, t *testing.T, ns, selector string) map[string]string {
	t.Helper()
	l, err := kubernetes.NewForConfigOrDie(env.RESTConfig()).CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, o := range l.Items {
		out[o.Namespace+"/"+o.Name] = o.ResourceVersion
	}
	return out
}

// Command demo shows informerd's point end to end: it starts a local
// control plane and the informerd binary, runs several separate
// `informerctl watch` processes on the same resource while it creates,
// updates and deletes objects, and prints what each client received, how
// many watches the API server itself held, and whether every client's final
// state equals a direct LIST. Ctrl-C stops everything at any time.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	bin := flag.String("bin", "_output/bin", "directory with the informerd and informerctl binaries")
	clients := flag.Int("clients", 5, "number of client processes")
	objects := flag.Int("objects", 20, "ConfigMaps to create (each is then updated twice; a quarter are deleted)")
	hold := flag.Bool("wait", false, "keep everything running after the report until Ctrl-C")
	flag.Parse()
	if *clients < 1 || *objects < 1 {
		return errors.New("-clients and -objects must be at least 1")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	say := func(format string, args ...any) { fmt.Printf("demo: "+format+"\n", args...) }

	say("starting the control plane (etcd, kube-apiserver)")
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		return err
	}
	defer cp.Stop()
	admin := kubernetes.NewForConfigOrDie(cp.RESTConfig())
	const ns = "demo"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	watchesBefore, err := configMapWatches(ctx, admin)
	if err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "informerd-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	socket := filepath.Join(dir, "informerd.sock")
	say("starting informerd on %s (every client authenticates with its own ServiceAccount token)", socket)
	daemon := command(ctx, filepath.Join(*bin, "informerd"), "-kubeconfig", cp.KubeconfigPath, "-socket", socket, "-metrics-address", "", "-log-level", "warn")
	daemon.Stdout, daemon.Stderr = os.Stderr, os.Stderr
	if err := daemon.Start(); err != nil {
		return err
	}
	defer terminate(daemon)
	// The demo itself looks at every informer: it may get /informerd/informers.
	token, err := identity(ctx, admin, ns, "demo", "", rbacv1.PolicyRule{NonResourceURLs: []string{"/informerd/informers"}, Verbs: []string{"get"}})
	if err != nil {
		return err
	}
	c, err := client.Dial(socket, client.WithToken(token))
	if err != nil {
		return err
	}
	defer c.Close()

	say("starting %d client processes: informerctl -token-file <its own> watch configmaps -n %s -o wide", *clients, ns)
	procs := make([]*clientProc, *clients)
	var wg sync.WaitGroup
	defer wg.Wait() // runs after the deferred terminations below
	for i := range procs {
		name := fmt.Sprintf("client-%d", i)
		// Each client may list and watch ConfigMaps in the demo's namespace, and nothing else.
		token, err := identity(ctx, admin, ns, name, ns, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}})
		if err != nil {
			return err
		}
		tokenFile := filepath.Join(dir, name+".token")
		if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
			return err
		}
		p, err := startClient(ctx, filepath.Join(*bin, "informerctl"), socket, tokenFile, ns, name, &wg)
		if err != nil {
			return err
		}
		procs[i] = p
		defer terminate(p.cmd)
	}
	if err := waitFor(ctx, "every client subscribed", func() bool {
		resp, err := c.API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
		return err == nil && len(resp.GetInformers()) == 1 && int(resp.GetInformers()[0].GetRefCount()) == *clients
	}); err != nil {
		return err
	}
	watchesShared, err := configMapWatches(ctx, admin)
	if err != nil {
		return err
	}

	say("creating %d ConfigMaps, updating each twice, deleting %d", *objects, *objects/4)
	cms := admin.CoreV1().ConfigMaps(ns)
	for i := range *objects {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%03d", i)}, Data: map[string]string{"v": "0"}}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	for round := 1; round <= 2; round++ {
		for i := range *objects {
			cm, err := cms.Get(ctx, fmt.Sprintf("cm-%03d", i), metav1.GetOptions{})
			if err != nil {
				return err
			}
			cm.Data["v"] = strconv.Itoa(round)
			if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
	}
	for i := range *objects / 4 {
		if err := cms.Delete(ctx, fmt.Sprintf("cm-%03d", i), metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	list, err := cms.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	want := map[string]string{}
	for _, cm := range list.Items {
		want[ns+"/"+cm.Name] = cm.ResourceVersion
	}
	// Converged, or 30 s: the table tells either way.
	_ = waitFor(ctx, "clients converged", func() bool {
		for _, p := range procs {
			if !maps.Equal(p.state(), want) {
				return false
			}
		}
		return true
	})

	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIENT\tEVENTS\tOBJECTS\tFINAL STATE == LIST")
	for i, p := range procs {
		state := p.state()
		fmt.Fprintf(tw, "client-%d\t%d\t%d\t%v\n", i, p.eventCount(), len(state), maps.Equal(state, want))
	}
	tw.Flush()
	fmt.Printf("\nclients: %d; watches of configmaps the API server holds (its own apiserver_longrunning_requests): %d before informerd, %d with informerd and %d clients (+%d)\n",
		*clients, watchesBefore, watchesShared, *clients, watchesShared-watchesBefore)
	fmt.Printf("objects: %d created, %d updates, %d deleted; LIST shows %d\n\n", *objects, 2**objects, *objects/4, len(want))

	if *hold {
		say("still running: KUBECONFIG=%s, informerctl -address %s -token-file %s informers; Ctrl-C stops everything",
			cp.KubeconfigPath, socket, filepath.Join(dir, "client-0.token"))
		<-ctx.Done()
	}
	say("stopping")
	return nil
}

// command returns a process that dies with the demo.
func command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// terminate stops a process: SIGTERM, then SIGKILL after 5 s.
func terminate(cmd *exec.Cmd) {
	if cmd.Process == nil || cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// clientProc is one informerctl watch process and the state it printed.
type clientProc struct {
	cmd *exec.Cmd

	mu     sync.Mutex // guards store and events
	store  map[string]string
	events int
}

func startClient(ctx context.Context, informerctl, socket, tokenFile, ns, name string, wg *sync.WaitGroup) (*clientProc, error) {
	cmd := command(ctx, informerctl, "-address", socket, "-token-file", tokenFile, "watch", "configmaps", "-n", ns, "-client-name", name, "-o", "wide")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &clientProc{cmd: cmd, store: map[string]string{}}
	wg.Add(1)
	go func() { // ends when the process closes its stdout
		defer wg.Done()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			// EVENT NAME AGE RESOURCEVERSION LABELS; SYNCED alone.
			f := strings.Fields(sc.Text())
			if len(f) < 4 || f[0] == "EVENT" {
				continue
			}
			key := ns + "/" + f[1]
			p.mu.Lock()
			p.events++
			if f[0] == "DELETED" {
				delete(p.store, key)
			} else {
				p.store[key] = f[3]
			}
			p.mu.Unlock()
		}
	}()
	return p, nil
}

func (p *clientProc) state() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.store)
}

func (p *clientProc) eventCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.events
}

func waitFor(ctx context.Context, what string, cond func() bool) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// identity creates ServiceAccount ns/name with rules in namespace ("" for
// cluster-wide ones) and returns a token for it with informerd's audience.
func identity(ctx context.Context, admin kubernetes.Interface, ns, name, namespace string, rules ...rbacv1.PolicyRule) (string, error) {
	token, err := controlplane.ServiceAccountToken(ctx, admin, ns, name, "informerd")
	if err != nil {
		return "", err
	}
	return token, controlplane.Grant(ctx, admin, ns, name, namespace, rules...)
}

// configMapWatches reads how many watches of configmaps the API server
// holds, from its own metrics.
func configMapWatches(ctx context.Context, admin kubernetes.Interface) (int, error) {
	b, err := admin.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	total := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "apiserver_longrunning_requests{") &&
			strings.Contains(line, `resource="configmaps"`) && strings.Contains(line, `verb="WATCH"`) {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return int(total), nil
}

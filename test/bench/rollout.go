package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/statuswatcher"
	"github.com/informerd/informerd/test/controlplane"
)

// rolloutResult is the rollout run of `bench status -rollout R`: one
// Deployment of R replicas created, then rolled out to a new template,
// each phase waited for through informerd's WatchStatus, while a
// bystander (an unrelated applier in another namespace) waits for its own
// objects through the same daemon.
type rolloutResult struct {
	// Daemon is the informerd binary the run used.
	Daemon   string `json:"daemon"`
	Replicas int    `json:"replicas"`
	// Idle is the bystander's latency before the Deployment exists.
	Idle   latencyStats   `json:"idleProbe"`
	Phases []rolloutPhase `json:"phases"`
}

// rolloutPhase is one wait for the Deployment to be Current.
type rolloutPhase struct {
	Name        string  `json:"name"`
	WallSeconds float64 `json:"wallSeconds"`
	// DaemonCPUSeconds is informerd's utime+stime over the phase.
	DaemonCPUSeconds float64 `json:"daemonCpuSeconds"`
	// Computations is how many statuses the daemon computed over the
	// phase (informerd_status_computations_total), and Events how many
	// status events the Deployment's watcher received.
	Computations float64 `json:"computations"`
	Events       int     `json:"events"`
	// Probe is the bystander's latency over the phase.
	Probe latencyStats `json:"probe"`
}

// latencyStats are a probe's samples: from the bystander's write to its
// status through informerd, and to the same change on a direct watch of
// the API server (what the API server alone takes).
type latencyStats struct {
	Samples   int     `json:"samples"`
	P50Millis float64 `json:"p50Millis"`
	P99Millis float64 `json:"p99Millis"`
	MaxMillis float64 `json:"maxMillis"`
	// DirectP50Millis and DirectP99Millis are the direct watch's.
	DirectP50Millis float64 `json:"directP50Millis"`
	DirectP99Millis float64 `json:"directP99Millis"`
}

// probeSample is one bystander write: when it started, and how long until
// informerd's status and the direct watch's event showed it.
type probeSample struct {
	start             time.Time
	status, direct    time.Duration
	statusOK, directO bool
}

const (
	rolloutNamespace   = "rollout"
	bystanderNamespace = "bystander"
	rolloutName        = "big"
	probeName          = "probe"
)

// bystanderRules: the bystander's WatchStatus reads ConfigMaps in its
// namespace.
var bystanderRules = []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"list", "watch"}}}

// runRollout runs the rollout run against a daemon of its own.
func (h *statusHarness) runRollout(ctx context.Context, informerd string, replicas int) (*rolloutResult, error) {
	res := &rolloutResult{Daemon: informerd, Replicas: replicas}
	admin := h.admin()
	for _, ns := range []string{rolloutNamespace, bystanderNamespace} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		if err := controlplane.WaitForDefaultServiceAccount(ctx, admin, ns); err != nil {
			return nil, err
		}
	}
	defer h.deleteNamespaces(admin, []string{rolloutNamespace, bystanderNamespace})
	appToken, err := h.applierToken(ctx, admin, rolloutNamespace)
	if err != nil {
		return nil, err
	}
	byToken, err := h.token(ctx, admin, bystanderNamespace, "bystander", bystanderNamespace, bystanderRules...)
	if err != nil {
		return nil, err
	}
	scraper, err := controlplane.ServiceAccountToken(ctx, admin, rolloutNamespace, "scraper", "informerd")
	if err != nil {
		return nil, err
	}
	if err := controlplane.Grant(ctx, admin, rolloutNamespace, "scraper", "", scrapeRule); err != nil {
		return nil, err
	}
	d, err := startDaemon(ctx, informerd, h.cp.KubeconfigPath)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	computations := func() (float64, error) {
		b, err := scrape(ctx, d.metrics+"/metrics", scraper)
		if err != nil {
			return 0, err
		}
		return metricSum(b, "informerd_status_computations_total"), nil
	}

	// The Deployment's watcher, as its applier's cli-utils WaitTask holds it.
	appClient, err := client.Dial(d.socket, client.WithTokenFile(appToken))
	if err != nil {
		return nil, err
	}
	defer appClient.Close()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	depID := object.ObjMetadata{GroupKind: schema.GroupKind{Group: "apps", Kind: "Deployment"}, Namespace: rolloutNamespace, Name: rolloutName}
	events := statuswatcher.New(appClient, statuswatcher.Options{ClientName: "rollout"}).
		Watch(wctx, object.ObjMetadataSet{depID}, watcher.Options{RESTScopeStrategy: watcher.RESTScopeNamespace})

	// The bystander, probing until the run ends.
	probe, err := startProbe(ctx, admin, d.socket, byToken)
	if err != nil {
		return nil, err
	}
	defer func() { _ = probe.stop() }() // an early return has its own error; the end checks stop's
	say("rollout: bystander's latency with nothing else going on")
	idleStart := time.Now()
	if err := sleep(ctx, 10*time.Second); err != nil {
		return nil, err
	}
	res.Idle = probe.stats(idleStart, time.Now())

	phase := func(name string, generation int64, change func() error) error {
		say("rollout: %s, %d replicas", name, replicas)
		cpu0, err := d.cpu()
		if err != nil {
			return err
		}
		comp0, err := computations()
		if err != nil {
			return err
		}
		start := time.Now()
		if err := change(); err != nil {
			return err
		}
		n, err := waitCurrent(ctx, events, generation, h.timeout)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		end := time.Now()
		cpu1, err := d.cpu()
		if err != nil {
			return err
		}
		comp1, err := computations()
		if err != nil {
			return err
		}
		res.Phases = append(res.Phases, rolloutPhase{
			Name: name, WallSeconds: end.Sub(start).Seconds(), DaemonCPUSeconds: cpu1 - cpu0,
			Computations: comp1 - comp0, Events: n, Probe: probe.stats(start, end),
		})
		return nil
	}
	deployments := admin.AppsV1().Deployments(rolloutNamespace)
	err = phase("create", 1, func() error {
		dep := bigDeployment(rolloutNamespace, rolloutName, int32(replicas))
		_, err := deployments.Create(ctx, dep, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	err = phase("update", 2, func() error {
		patch := []byte(`{"spec":{"template":{"metadata":{"annotations":{"bench/rollout":"2"}}}}}`)
		_, err := deployments.Patch(ctx, rolloutName, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := probe.stop(); err != nil {
		return nil, fmt.Errorf("the bystander: %w", err)
	}
	return res, nil
}

// waitCurrent reads events until the Deployment is Current at generation
// or later, and returns how many status events it read.
func waitCurrent(ctx context.Context, events <-chan event.Event, generation int64, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n, fmt.Errorf("waiting for the Deployment to be Current: %w", ctx.Err())
		case e, ok := <-events:
			if !ok {
				return n, errors.New("the status watcher ended")
			}
			switch e.Type {
			case event.ErrorEvent:
				return n, e.Error
			case event.ResourceUpdateEvent:
				n++
				rs := e.Resource
				if rs.Status == kstatus.CurrentStatus && rs.Resource != nil && rs.Resource.GetGeneration() >= generation {
					return n, nil
				}
			}
		}
	}
}

// bigDeployment is benchDeployment with replicas.
func bigDeployment(ns, name string, replicas int32) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none:1"}}},
			},
		},
	}
}

// token gives ServiceAccount name of saNamespace rules in namespace and
// returns a token of it for informerd's audience, in a file.
func (h *statusHarness) token(ctx context.Context, admin *kubernetes.Clientset, saNamespace, name, namespace string, rules ...rbacv1.PolicyRule) (string, error) {
	token, err := controlplane.ServiceAccountToken(ctx, admin, saNamespace, name, "informerd")
	if err != nil {
		return "", err
	}
	if err := controlplane.Grant(ctx, admin, saNamespace, name, namespace, rules...); err != nil {
		return "", err
	}
	path := h.tokens + "/" + saNamespace + "-" + name
	return path, os.WriteFile(path, []byte(token), 0o600)
}

// probe is the bystander: it creates and deletes one ConfigMap in turn and
// times each change to its status through informerd and to its event on
// a direct watch.
type probe struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	err    error
	// samples are guarded by mu.
	samples []probeSample
}

func startProbe(ctx context.Context, admin *kubernetes.Clientset, socket, token string) (*probe, error) {
	c, err := client.Dial(socket, client.WithTokenFile(token))
	if err != nil {
		return nil, err
	}
	cms := admin.CoreV1().ConfigMaps(bystanderNamespace)
	direct, err := cms.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + probeName})
	if err != nil {
		c.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &probe{cancel: cancel, done: make(chan struct{})}
	id := object.ObjMetadata{GroupKind: schema.GroupKind{Kind: "ConfigMap"}, Namespace: bystanderNamespace, Name: probeName}
	events := statuswatcher.New(c, statuswatcher.Options{ClientName: "bystander"}).
		Watch(ctx, object.ObjMetadataSet{id}, watcher.Options{RESTScopeStrategy: watcher.RESTScopeNamespace})
	go func() { // ends with cancel
		defer close(p.done)
		defer c.Close()
		defer direct.Stop()
		err := p.run(ctx, cms, events, direct.ResultChan())
		if ctx.Err() == nil {
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
		}
	}()
	return p, nil
}

// probeTimeout bounds one probe's wait: a sample that takes longer counts
// as this.
const probeTimeout = 30 * time.Second

func (p *probe) run(ctx context.Context, cms interface {
	Create(context.Context, *corev1.ConfigMap, metav1.CreateOptions) (*corev1.ConfigMap, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
}, events <-chan event.Event, direct <-chan watch.Event) error {
	for i := 0; ; i++ {
		exists := i%2 == 0
		want, wantDirect := kstatus.NotFoundStatus, watch.Deleted
		if exists {
			want, wantDirect = kstatus.CurrentStatus, watch.Added
		}
		s := probeSample{start: time.Now()}
		var err error
		if exists {
			_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: probeName}, Data: map[string]string{"i": strconv.Itoa(i)}}, metav1.CreateOptions{})
		} else {
			err = cms.Delete(ctx, probeName, metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsAlreadyExists(err) && !apierrors.IsNotFound(err) {
			return err
		}
		timeout := time.NewTimer(probeTimeout)
		for !s.statusOK || !s.directO {
			select {
			case <-ctx.Done():
				timeout.Stop()
				return ctx.Err()
			case <-timeout.C:
				s.status, s.direct, s.statusOK, s.directO = probeTimeout, probeTimeout, true, true
			case e, ok := <-events:
				if !ok {
					return errors.New("the bystander's status watcher ended")
				}
				if e.Type == event.ErrorEvent {
					return e.Error
				}
				if e.Type == event.ResourceUpdateEvent && e.Resource.Status == want && !s.statusOK {
					s.status, s.statusOK = time.Since(s.start), true
				}
			case e, ok := <-direct:
				if !ok {
					return errors.New("the direct watch ended")
				}
				if e.Type == wantDirect && !s.directO {
					s.direct, s.directO = time.Since(s.start), true
				}
			}
		}
		timeout.Stop()
		p.mu.Lock()
		p.samples = append(p.samples, s)
		p.mu.Unlock()
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}

// stats summarizes the samples that started in [from, to).
func (p *probe) stats(from, to time.Time) latencyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var st, di []float64
	for _, s := range p.samples {
		if !s.start.Before(from) && s.start.Before(to) {
			st = append(st, float64(s.status)/1e6)
			di = append(di, float64(s.direct)/1e6)
		}
	}
	slices.Sort(st)
	slices.Sort(di)
	if len(st) == 0 {
		return latencyStats{}
	}
	return latencyStats{
		Samples: len(st), P50Millis: quantile(st, 0.5), P99Millis: quantile(st, 0.99), MaxMillis: st[len(st)-1],
		DirectP50Millis: quantile(di, 0.5), DirectP99Millis: quantile(di, 0.99),
	}
}

func quantile(sorted []float64, q float64) float64 {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// stop ends the probe and returns the error that ended it early, if any.
func (p *probe) stop() error {
	p.cancel()
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (r *rolloutResult) print(w io.Writer) {
	fmt.Fprintf(w, "\n%s: rollout of one Deployment of %d replicas; the bystander's status latency with nothing else going on: p50 %.1f ms, p99 %.1f ms (direct watch p50 %.1f ms) over %d samples\n\n",
		r.Daemon, r.Replicas, r.Idle.P50Millis, r.Idle.P99Millis, r.Idle.DirectP50Millis, r.Idle.Samples)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\twall s\tdaemon CPU s\tdaemon CPU s/s\tcomputations\tstatus events\tbystander p50 ms\tp99 ms\tmax ms\tdirect p50 ms\tdirect p99 ms\tsamples\t")
	for _, p := range r.Phases {
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.2f\t%.0f\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%d\t\n", p.Name, p.WallSeconds, p.DaemonCPUSeconds,
			p.DaemonCPUSeconds/p.WallSeconds, p.Computations, p.Events, p.Probe.P50Millis, p.Probe.P99Millis, p.Probe.MaxMillis,
			p.Probe.DirectP50Millis, p.Probe.DirectP99Millis, p.Probe.Samples)
	}
	_ = tw.Flush()
}

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
	"github.com/informerd/informerd/test/controlplane"
)

// The deployed daemon's identity: deploy/base's namespace and ServiceAccount.
const (
	deployNamespace = "informerd"
	// helmNamespace is where TestDeploy installs the chart: not deploy/'s,
	// so that the audit log tells the two installations apart.
	helmNamespace = "informerd-helm"
	exampleNS     = "informerd-example"
	exampleSA     = "configmap-watcher"
)

// auditLog is the API server's audit log of the requests of every
// ServiceAccount in deploy/'s and the chart's namespaces (that is, of the
// deployed daemons),
// and nothing else: TestDeploy reads what the daemon did from it.
type auditLog struct {
	dir   string
	path  string
	flags []string // kube-apiserver's flags writing it
}

// startAuditLog writes the audit policy for TestMain's control plane.
func startAuditLog() (*auditLog, error) {
	dir, err := os.MkdirTemp("", "informerd-e2e-audit-")
	if err != nil {
		return nil, err
	}
	policy := `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts:` + deployNamespace + `", "system:serviceaccounts:` + helmNamespace + `"]
  # Every watch, for upstreamWatches.
  - level: Metadata
    verbs: ["watch"]
  - level: None
`
	a := &auditLog{dir: dir, path: filepath.Join(dir, "audit.log")}
	if err := os.WriteFile(filepath.Join(dir, "policy.yaml"), []byte(policy), 0o600); err != nil {
		return nil, err
	}
	// The log backend's default mode (blocking) writes each event before
	// the request goes on.
	a.flags = []string{"--audit-policy-file=" + filepath.Join(dir, "policy.yaml"), "--audit-log-path=" + a.path, "--audit-log-format=json"}
	deployAudit = a
	return a, nil
}

func (a *auditLog) remove() { _ = os.RemoveAll(a.dir) }

// deployAudit is TestMain's audit log.
var deployAudit *auditLog

// auditEvent is what TestDeploy reads of an audit.k8s.io/v1 Event.
type auditEvent struct {
	Verb string `json:"verb"`
	User struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		APIGroup    string `json:"apiGroup"`
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	RequestURI     string `json:"requestURI"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// access is one verb on one resource.
type access struct{ group, resource, verb string }

func (a access) String() string {
	return fmt.Sprintf("%s %s", a.verb, schema.GroupResource{Group: a.group, Resource: a.resource})
}

// audited returns what user did (and was allowed) and what it was refused,
// by the audit log.
func (a *auditLog) audited(t *testing.T, user string) (allowed map[access]bool, refused []string) {
	t.Helper()
	f, err := os.Open(a.path)
	if err != nil {
		t.Fatalf("the API server's audit log: %v", err)
	}
	defer f.Close()
	allowed = map[access]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev auditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("audit log line %q: %v", sc.Text(), err)
		}
		if ev.User.Username != user || ev.ResponseStatus == nil {
			continue
		}
		if ev.ResponseStatus.Code == 401 || ev.ResponseStatus.Code == 403 {
			refused = append(refused, fmt.Sprintf("%d %s %s", ev.ResponseStatus.Code, ev.Verb, ev.RequestURI))
			continue
		}
		if ev.ObjectRef != nil && ev.ObjectRef.Subresource == "" && ev.ResponseStatus.Code < 400 {
			allowed[access{ev.ObjectRef.APIGroup, ev.ObjectRef.Resource, ev.Verb}] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return allowed, refused
}

// TestDeploy installs informerd for real, as operators do, and checks each
// installation the same way (checkDeployed): first deploy/ with kustomize
// (kubectl apply -k --server-side), then, once that is deleted, the Helm
// chart deploy/helm/informerd (helm install, into namespace
// informerd-helm, so that the audit log tells the two daemons' requests
// apart; TestHelmChartMatchesKustomize in deploy/ shows that the chart
// renders deploy/'s objects). Both with TLS are accepted by the API server
// (server-side dry runs: overlays/node-ip, the chart with tls.enabled).
// The example client (deploy/examples/client) is applied once.
func TestDeploy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin, err := controlplane.BinDir(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, self, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(self), "..", "..", "deploy")
	command := func(name string, args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // cleanups too
		defer cancel()
		out, err := exec.CommandContext(ctx, name, append([]string{"--kubeconfig", env.KubeconfigPath}, args...)...).CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("%s %v: %w\n%s", filepath.Base(name), args, err, out)
		}
		return string(out), nil
	}
	kubectl := func(args ...string) (string, error) { return command(filepath.Join(bin, "kubectl"), args...) }
	must := func(t *testing.T, tool func(...string) (string, error), args ...string) string {
		t.Helper()
		out, err := tool(args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}

	// What the manifests must say, whatever an operator changes around it.
	rendered := map[string]string{}
	for _, dir := range []string{".", "overlays/node-ip", "examples/client"} {
		rendered[dir] = must(t, kubectl, "kustomize", filepath.Join(deploy, dir))
	}
	for _, tt := range []struct{ dir, want string }{
		{".", "-node-name=$(NODE_NAME)"},
		{".", "fieldPath: spec.nodeName"},
		{".", "readOnlyRootFilesystem: true"},
		{".", "allowPrivilegeEscalation: false"},
		{".", "- ALL"},
		{".", "type: RuntimeDefault"},
		{".", "priorityClassName: system-node-critical"},
		{".", "path: /readyz"},
		{"overlays/node-ip", "-tls-cert-file="},
		{"overlays/node-ip", "hostPort: 7650"},
		{"overlays/node-ip", "name: informerd-metrics"},
		{"examples/client", "audience: " + auth.DefaultAudience},
		{"examples/client", "path: /var/run/informerd"},
	} {
		if !strings.Contains(rendered[tt.dir], tt.want) {
			t.Errorf("deploy/%s does not contain %q", tt.dir, tt.want)
		}
	}
	for dir, out := range rendered {
		if strings.Contains(out, "insecure") {
			t.Errorf("deploy/%s uses the development mode", dir)
		}
	}

	example := filepath.Join(deploy, "examples", "client")
	must(t, kubectl, "apply", "--server-side", "-k", example)
	t.Cleanup(func() {
		if out, err := kubectl("delete", "--ignore-not-found", "--wait=false", "-k", example); err != nil {
			t.Logf("cleanup: %v\n%s", err, out)
		}
	})

	t.Run("kustomize", func(t *testing.T) {
		must(t, kubectl, "apply", "--server-side", "-k", deploy)
		// Its cluster-scoped objects (the RBAC) are gone when this returns,
		// before the chart creates its own of the same names.
		t.Cleanup(func() {
			if out, err := kubectl("delete", "--ignore-not-found", "--wait=false", "-k", deploy); err != nil {
				t.Logf("cleanup: %v\n%s", err, out)
			}
		})
		must(t, kubectl, "apply", "--server-side", "--dry-run=server", "-k", filepath.Join(deploy, "overlays", "node-ip"))
		checkDeployed(ctx, t, deployNamespace)
	})
	t.Run("helm", func(t *testing.T) {
		helmBin := os.Getenv("INFORMERD_HELM")
		if helmBin == "" {
			t.Fatal("INFORMERD_HELM is not set: run make test-e2e (or make helm, and set it to the path it prints)")
		}
		helm := func(args ...string) (string, error) { return command(helmBin, args...) }
		chart := filepath.Join(deploy, "helm", "informerd")
		// As docs/helm.md says: helm stores the release in the namespace
		// before it applies the chart's Namespace (which labels it).
		must(t, helm, "install", "informerd", chart, "--namespace", helmNamespace, "--create-namespace")
		t.Cleanup(func() {
			if out, err := helm("uninstall", "informerd", "--namespace", helmNamespace); err != nil {
				t.Logf("cleanup: %v\n%s", err, out)
			}
		})
		must(t, helm, "upgrade", "informerd", chart, "--namespace", helmNamespace, "--dry-run=server", "--set", "tls.enabled=true")
		checkDeployed(ctx, t, helmNamespace)
	})
}

// checkDeployed checks informerd installed in namespace (its Namespace,
// ServiceAccount informerd, ClusterRole informerd, DaemonSet, FlowSchema
// and PriorityLevelConfiguration) by
// running the informerd binary with the deployed ServiceAccount's
// credentials:
//   - the namespace is labelled Pod Security privileged; the DaemonSet's
//     pod is scheduled onto the fake node and runs (kwok)
//     as the non-root user with no capability, after the root init step
//     that prepares the socket's directory (checkNonRoot), as does the
//     example client's;
//   - the informerd binary, with a token of the deployed ServiceAccount
//     bound to the DaemonSet's pod (what the kubelet projects) and
//     -node-name of that pod's node, serves the example client's identity
//     (a token bound to its pod, with informerd's audience) what its Role
//     allows and refuses it the rest; the example client's own command
//     line (informerctl watch, from its Deployment) prints its namespace's
//     ConfigMap; and it serves a client of its own every
//     resource the ClusterRole names, in every namespace;
//   - the API server's Priority and Fairness classifies the daemon's
//     LISTs into its own priority level (checkOwnFlow);
//   - the installed RBAC is enough and nothing in it is unused: the API
//     server's audit log shows every verb on every resource of every rule
//     of the installed ClusterRole used by the daemon, and nothing it
//     asked refused; the daemon logged no "forbidden". The verb list is
//     used by a second daemon with -disable-watch-list (informerd's
//     fallback when the API server refuses WatchList), watch by both.
func checkDeployed(ctx context.Context, t *testing.T, namespace string) {
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	ns, err := admin.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("namespace %s has labels %v, want Pod Security privileged (the daemon mounts a hostPath)", namespace, ns.Labels)
	}
	daemonPod := runningPod(ctx, t, admin, namespace, "app.kubernetes.io/name=informerd")
	clientPod := runningPod(ctx, t, admin, exampleNS, "app.kubernetes.io/name="+exampleSA)
	checkNonRoot(t, daemonPod)

	// The daemon's credentials: what the kubelet projects into its pod.
	token, err := controlplane.PodToken(ctx, admin, namespace, "informerd", daemonPod.Name)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := tokenKubeconfig(t, token)
	checkOwnFlow(ctx, t, admin, token)
	logs := filepath.Join(t.TempDir(), "informerd.log")
	out, err := os.Create(logs)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	dir := t.TempDir()
	daemons := []*daemonProc{
		startDaemonProcessTo(t, filepath.Join(dir, "deployed.sock"), out, "-kubeconfig", kubeconfig, "-node-name", daemonPod.Spec.NodeName, "-log-level", "info"),
		startDaemonProcessTo(t, filepath.Join(dir, "list.sock"), out, "-kubeconfig", kubeconfig, "-node-name", daemonPod.Spec.NodeName, "-log-level", "info", "-disable-watch-list"),
	}

	// The example client's identity: a token bound to its pod, as the
	// kubelet projects it, for informerd's audience.
	exampleToken, err := controlplane.PodToken(ctx, admin, exampleNS, exampleSA, clientPod.Name, auth.DefaultAudience)
	if err != nil {
		t.Fatal(err)
	}
	configMaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	name := "deployed-by-" + namespace // one per installation
	createConfigMap(ctx, t, exampleNS, name, map[string]string{"k": "v"})
	example := dialWith(t, daemons[0].socket, client.WithToken(exampleToken))
	got := openStream(ctx, t, example, client.WatchOptions{Resource: configMaps, Namespace: exampleNS}, "").
		until(ctx, t, "the example client's ConfigMaps", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
	if !strings.Contains(describe(got), "ADDED "+exampleNS+"/"+name) {
		t.Fatalf("the example client got %s; want its namespace's ConfigMap", describe(got))
	}
	runExampleClient(ctx, t, admin, clientPod, daemons[0].socket, exampleToken, name)
	exampleUser := "system:serviceaccount:" + exampleNS + ":" + exampleSA
	for _, tt := range []struct {
		opts client.WatchOptions
		want string
	}{
		{client.WatchOptions{Resource: configMaps, Namespace: "default"}, exampleUser + " may not list configmaps in namespace default"},
		{client.WatchOptions{Resource: configMaps}, exampleUser + " may not list configmaps cluster-wide"},
		{client.WatchOptions{Resource: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: exampleNS}, exampleUser + " may not list pods"},
	} {
		err := openStream(ctx, t, example, tt.opts, "").end(ctx, t)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("the example client watching %s in %q: %v; want PERMISSION_DENIED: %s", tt.opts.Resource.Resource, tt.opts.Namespace, err, tt.want)
		}
	}

	// Every resource the applied ClusterRole names, for a client allowed
	// exactly those, through both daemons.
	role, err := admin.RbacV1().ClusterRoles().Get(ctx, "informerd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(admin.Discovery())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	var want []access
	var served []schema.GroupVersionResource
	for _, rule := range role.Rules {
		if len(rule.NonResourceURLs) > 0 || slices.Contains(rule.Verbs, "*") {
			t.Fatalf("ClusterRole informerd has rule %v: informerd uses no non-resource URL and no verb but list, watch and create", rule)
		}
		for _, g := range rule.APIGroups {
			for _, r := range rule.Resources {
				if g == "*" || r == "*" {
					t.Fatalf("ClusterRole informerd has rule %v: name the resources, so that each is checked", rule)
				}
				for _, v := range rule.Verbs {
					want = append(want, access{g, r, v})
				}
				if slices.Contains(rule.Verbs, "watch") {
					gvr, err := mapper.ResourceFor(schema.GroupVersionResource{Group: g, Resource: r})
					if err != nil {
						t.Fatalf("ClusterRole informerd names %s.%s: %v", r, g, err)
					}
					served = append(served, gvr)
				}
			}
		}
	}
	var perms []permission
	for _, gvr := range served {
		perms = append(perms, reads(gvr, ""))
	}
	reader := identity(t, perms...)
	for _, d := range daemons {
		c := dialWith(t, d.socket, client.WithToken(reader))
		for _, gvr := range served {
			openStream(ctx, t, c, client.WatchOptions{Resource: gvr}, "").
				until(ctx, t, gvr.String()+" in all namespaces", isType(informerdv1.EventType_EVENT_TYPE_SYNCED))
		}
	}
	for _, d := range daemons {
		d.signal(syscall.SIGTERM)
	}

	log, err := os.ReadFile(logs)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(string(log)), "forbidden") {
		t.Errorf("the daemon was refused something with the shipped RBAC; its log:\n%s", log)
	}
	if !env.Owned() {
		t.Skip("the audit log needs the control plane this test binary starts; attached to a running cluster, the ClusterRole's use is not checked")
	}
	var allowed map[access]bool
	var refused, unused []string
	// The audit event of a LIST is written as its response completes, so
	// possibly just after the daemon has the objects.
	auditCtx, cancelAudit := context.WithTimeout(ctx, 15*time.Second)
	defer cancelAudit()
	err = waitFor(auditCtx, func() bool {
		allowed, refused = deployAudit.audited(t, "system:serviceaccount:"+namespace+":informerd")
		unused = unused[:0]
		for _, a := range want {
			if !allowed[a] {
				unused = append(unused, a.String())
			}
		}
		return len(unused) == 0
	})
	if err != nil {
		t.Errorf("in ClusterRole informerd but never used by the daemon: %v", unused)
	}
	if len(refused) > 0 {
		t.Errorf("the API server refused the daemon: %v", refused)
	}
	t.Logf("the daemon used %d accesses of ClusterRole informerd's %d", len(want)-len(unused), len(want))
}

// runExampleClient runs the example client Deployment's container command
// line (informerctl watch) as the Deployment gives it, with its
// environment, against socket with token in place of the pod's mounts,
// until it prints want.
func runExampleClient(ctx context.Context, t *testing.T, admin kubernetes.Interface, pod *corev1.Pod, socket, token, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	dep, err := admin.AppsV1().Deployments(pod.Namespace).Get(ctx, exampleSA, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctr := dep.Spec.Template.Spec.Containers[0]
	if len(ctr.Command) != 1 || ctr.Command[0] != "/informerctl" {
		t.Fatalf("the example client runs %v; this test runs /informerctl", ctr.Command)
	}
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"POD_NAMESPACE": pod.Namespace, "POD_NAME": pod.Name}
	local := map[string]string{"/var/run/informerd/informerd.sock": socket, client.DefaultTokenFile: tokenPath}
	var args []string
	replaced := 0
	for _, a := range ctr.Args {
		for v, val := range vars {
			a = strings.ReplaceAll(a, "$("+v+")", val)
		}
		for path, here := range local {
			if strings.HasSuffix(a, "="+path) {
				a = strings.TrimSuffix(a, path) + here
				replaced++
			}
		}
		args = append(args, a)
	}
	if replaced != len(local) {
		t.Fatalf("the example client's args %v do not name the socket and the token file as -flag=%v", ctr.Args, slices.Collect(maps.Keys(local)))
	}
	cmd := exec.CommandContext(ctx, informerctlBin.build(t), args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	found := false
	for !found && sc.Scan() { // ends when the process does (ctx kills it)
		out.WriteString(sc.Text() + "\n")
		found = strings.Contains(sc.Text(), want)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !found {
		t.Fatalf("the example client (informerctl %v) never printed %q; stdout:\n%s\nstderr:\n%s", args, want, out.String(), stderr.String())
	}
}

// checkNonRoot fails unless the daemon's pod runs the daemon as the
// image's non-root user (65532) with no capability, after an init
// container that is root with CAP_CHOWN only and prepares the socket's
// directory for it (TestNonRootDaemonServesOtherUsers runs both steps for
// real, as those users).
func checkNonRoot(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) != 1 {
		t.Fatalf("the daemon's pod has %d containers and %d init containers, want 1 and 1", len(pod.Spec.Containers), len(pod.Spec.InitContainers))
	}
	d, init := pod.Spec.Containers[0].SecurityContext, pod.Spec.InitContainers[0]
	if d == nil || d.RunAsUser == nil || *d.RunAsUser != 65532 || d.RunAsNonRoot == nil || !*d.RunAsNonRoot ||
		d.Capabilities == nil || len(d.Capabilities.Add) != 0 || !slices.Equal(d.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the daemon's container runs with %+v, want uid 65532, runAsNonRoot, every capability dropped", d)
	}
	ic := init.SecurityContext
	if !slices.Contains(init.Args, "-prepare-socket-dir=65532:65532") || ic == nil || ic.Capabilities == nil ||
		!slices.Equal(ic.Capabilities.Add, []corev1.Capability{"CHOWN"}) || !slices.Equal(ic.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("the init container %s runs %v with %+v, want -prepare-socket-dir=65532:65532 with CAP_CHOWN only", init.Name, init.Args, ic)
	}
}

// runningPod waits for the pod of namespace and selector to be scheduled
// onto the fake node and running, and returns it.
func runningPod(ctx context.Context, t *testing.T, admin kubernetes.Interface, namespace, selector string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := waitFor(ctx, func() bool {
		pods, err := admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false
		}
		for i, p := range pods.Items {
			if p.Spec.NodeName == controlplane.FakeNodeName && p.Status.Phase == corev1.PodRunning {
				pod = &pods.Items[i]
				return true
			}
		}
		return false
	})
	if err != nil {
		events, _ := admin.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{})
		var msgs []string
		for _, e := range events.Items {
			msgs = append(msgs, e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
		}
		t.Fatalf("no pod %s in %s running on %s: %v; events: %v", selector, namespace, controlplane.FakeNodeName, err, msgs)
	}
	return pod
}

// waitFor polls cond until it holds or ctx ends (eventually, returning
// the error).
func waitFor(ctx context.Context, cond func() bool) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// checkOwnFlow checks that the API server's Priority and Fairness
// classifies a LIST made with the deployed daemon's token by FlowSchema
// informerd into PriorityLevelConfiguration informerd (the headers it
// answers every request with name their UIDs), a level with the share
// deploy/flowcontrol states.
func checkOwnFlow(ctx context.Context, t *testing.T, admin kubernetes.Interface, token string) {
	t.Helper()
	fs, err := admin.FlowcontrolV1().FlowSchemas().Get(ctx, "informerd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := admin.FlowcontrolV1().PriorityLevelConfigurations().Get(ctx, "informerd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l := pl.Spec.Limited; l == nil || l.NominalConcurrencyShares == nil || *l.NominalConcurrencyShares != 30 {
		t.Errorf("PriorityLevelConfiguration informerd: %+v, want Limited with 30 nominal concurrency shares", pl.Spec)
	}
	cfg := rest.AnonymousClientConfig(env.RESTConfig())
	cfg.BearerToken = token
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, env.APIServerURL+"/api/v1/configmaps?limit=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the daemon's LIST: %s", resp.Status)
	}
	if got, got2 := resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID"), resp.Header.Get("X-Kubernetes-PF-PriorityLevel-UID"); got != string(fs.UID) || got2 != string(pl.UID) {
		t.Errorf("the daemon's LIST was classified by FlowSchema %s into priority level %s; want informerd's (%s, %s)", got, got2, fs.UID, pl.UID)
	}
}

// tokenKubeconfig writes a kubeconfig for the test control plane that
// authenticates with token alone.
func tokenKubeconfig(t *testing.T, token string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: env.APIServerURL, CertificateAuthorityData: env.RESTConfig().CAData}
	cfg.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	cfg.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

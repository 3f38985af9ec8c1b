package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/test/controlplane"
)

// TestExamples builds every program under examples/ (docs/adoption.md's
// one-line changes, one per ecosystem) and runs each against a daemon, as
// a client of its own with only the RBAC it needs, checking that each
// prints what the cluster holds: the ListerWatcher's and the dynamic
// client's ConfigMaps, the informer factory's Pods and ConfigMaps, the
// StatusWatcher's Deployment becoming Current, and the pod behind the
// address watcher's pod IP and port.
func TestExamples(t *testing.T) {
	_, self, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(self), "..", "..")
	bin := t.TempDir()
	// Before the clock starts: a build on a cold cache beside other tests
	// can take minutes.
	if err := goBuild(root, bin+string(os.PathSeparator), "./examples/..."); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	programs, err := os.ReadDir(filepath.Join(root, "examples"))
	if err != nil {
		t.Fatal(err)
	}

	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	ns := createNamespace(ctx, t, "examples")
	if err := controlplane.WaitForDefaultServiceAccount(ctx, admin, ns); err != nil {
		t.Fatal(err)
	}
	createConfigMap(ctx, t, ns, "example", map[string]string{"k": "v"})
	labels := map[string]string{"app": "web"}
	deployment := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "web", Image: "registry.invalid/web:1", Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				}}},
			},
		},
	}
	if _, err := admin.AppsV1().Deployments(ns).Create(ctx, deployment, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := runningPod(ctx, t, admin, ns, "app=web")
	if pod.Status.PodIP == "" {
		t.Fatalf("pod %s runs without an IP", pod.Name)
	}

	d := startDaemon(t, cache.Options{})
	gvr := func(group, resource string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: group, Version: "v1", Resource: resource}
	}
	configMaps, pods := reads(gvr("", "configmaps"), ns), reads(gvr("", "pods"), ns)
	for _, tt := range []struct {
		program string
		args    []string
		perms   []permission
		want    []string
	}{
		{"listerwatcher", []string{"-namespace", ns}, []permission{configMaps},
			[]string{"configmap " + ns + "/example\n", "synced 2 configmaps\n"}}, // and kube-root-ca.crt
		{"dynamic", []string{"-namespace", ns}, []permission{configMaps},
			[]string{"listed 2 configmaps\n", "configmap " + ns + "/example\n", "synced 2 configmaps\n"}},
		{"factory", []string{"-namespace", ns}, []permission{configMaps, pods},
			[]string{"pod " + ns + "/" + pod.Name + " Running\n", "configmap " + ns + "/example\n", "synced 1 pods, 2 configmaps\n"}},
		{"statuswatcher", []string{"-namespace", ns, "-deployment", "web"}, []permission{reads(gvr("apps", "deployments"), ns), reads(gvr("apps", "replicasets"), ns), pods},
			[]string{"deployment " + ns + "/web Current: "}},
		{"address", []string{"-target", net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(8080))}, []permission{readsPods},
			[]string{"pod " + ns + "/" + pod.Name + " ready="}},
	} {
		t.Run(tt.program, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			args := append([]string{"-address", d.socket, "-token-file", tokenFile(t, tt.perms...)}, tt.args...)
			out, err := exec.CommandContext(ctx, filepath.Join(bin, tt.program), args...).CombinedOutput()
			if err != nil {
				t.Fatalf("examples/%s %v: %v\n%s", tt.program, args, err, out)
			}
			for _, want := range tt.want {
				if !strings.Contains(string(out), want) {
					t.Errorf("examples/%s printed\n%s\nwant a line with %q", tt.program, out, want)
				}
			}
		})
	}
	// Every example is run above.
	for _, p := range programs {
		switch p.Name() {
		case "listerwatcher", "dynamic", "factory", "statuswatcher", "address":
		default:
			t.Errorf("examples/%s is not run by TestExamples", p.Name())
		}
	}
}

package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/test/controlplane"
)

// TestDeployManifestsAreValid: deploy/ applies cleanly (server-side dry
// run) to the real API server, so its schema and RBAC are accepted.
func TestDeployManifestsAreValid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin, err := controlplane.BinDir(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The namespaced objects need their namespace, which a dry run does
	// not create.
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "informerd"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Namespaces().Delete(context.Background(), "informerd", metav1.DeleteOptions{})
	})
	_, self, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(self), "..", "..", "deploy")
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), "--kubeconfig", env.KubeconfigPath,
		"apply", "--dry-run=server", "-k", deploy).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server -k deploy: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

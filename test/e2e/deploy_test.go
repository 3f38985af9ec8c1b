package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/test/controlplane"
)

// TestDeployManifestsAreValid: deploy/, with its TLS component and the example
// client apply cleanly (server-side dry run) to the real API server, so
// their schema and RBAC are accepted; and they carry the security the
// daemon relies on: the node's name, the review permissions, tokens with
// informerd's audience, never the development mode.
func TestDeployManifestsAreValid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin, err := controlplane.BinDir(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The namespaced objects need their namespaces, which a dry run does
	// not create.
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	for _, ns := range []string{"informerd", "informerd-example"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}
	_, self, _, _ := runtime.Caller(0)
	deploy := filepath.Join(filepath.Dir(self), "..", "..", "deploy")
	kubectl := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", env.KubeconfigPath}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	// The TLS component goes into an overlay of the user's, outside deploy/.
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, deploy)
	if err != nil {
		t.Fatal(err)
	}
	kustomization := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s]\n", rel, filepath.Join(rel, "components", "tls"))
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kustomization), 0o600); err != nil {
		t.Fatal(err)
	}
	rendered := map[string]string{}
	for dir, path := range map[string]string{".": deploy, "components/tls": overlay, "examples/client": filepath.Join(deploy, "examples", "client")} {
		t.Logf("%s", kubectl("apply", "--dry-run=server", "-k", path))
		rendered[dir] = kubectl("kustomize", path)
	}
	for _, tt := range []struct {
		dir, want string
	}{
		{".", "-node-name=$(NODE_NAME)"},
		{".", "fieldPath: spec.nodeName"},
		{".", "tokenreviews"},
		{".", "subjectaccessreviews"},
		{"components/tls", "-tls-cert-file="},
		{"components/tls", "hostPort: 7650"},
		{"examples/client", "audience: informerd"},
		{"examples/client", "-token-file=/var/run/secrets/informerd/token"},
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
}

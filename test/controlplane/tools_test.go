package controlplane

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// TestToolsShareInformerdsVersions: every module whose packages both
// informerd's commands and the tests' tools (tools/go.mod, which build.sh
// builds) compile is at one version in both, so that the tests' static
// builds of the commands reuse those packages from the build cache instead
// of compiling client-go, apimachinery and grpc a second time. It fails
// naming each module and both versions.
func TestToolsShareInformerdsVersions(t *testing.T) {
	if testing.Short() {
		t.Skip("lists both modules' dependencies")
	}
	tools := depModules(t, "tools", "tool", "./etcd")
	ours := depModules(t, "../..", "./cmd/...", "./examples/...")
	differ := map[string]bool{}
	for pkg, ourVersion := range ours {
		if toolVersion, ok := tools[pkg]; ok && toolVersion != ourVersion && !differ[ourVersion+" "+toolVersion] {
			differ[ourVersion+" "+toolVersion] = true
			t.Errorf("go.mod has %s, test/controlplane/tools/go.mod %s: go get the higher version in the other module, so that make test compiles its packages once",
				ourVersion, toolVersion)
		}
	}
	if len(ours) == 0 || len(tools) == 0 {
		t.Fatalf("listed %d module packages of informerd's and %d of the tools', want some of each", len(ours), len(tools))
	}
}

// depModules maps each package the patterns, listed in dir, depend on to
// module@version (the replacement's version, where a replace applies),
// leaving out the standard library and dir's own module.
func depModules(t *testing.T, dir string, patterns ...string) map[string]string {
	t.Helper()
	const format = `{{if and .Module (not .Module.Main)}}{{.ImportPath}} {{.Module.Path}}@{{with .Module.Replace}}{{.Version}}{{else}}{{.Module.Version}}{{end}}{{end}}`
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", format}, patterns...)...)
	cmd.Dir = dir
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list in %s: %v\n%s", dir, err, stderr)
	}
	m := map[string]string{}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		if pkg, version, ok := strings.Cut(sc.Text(), " "); ok {
			m[pkg] = version
		}
	}
	return m
}

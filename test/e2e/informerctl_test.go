package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/internal/version"
)

// ctl runs informerctl against socket as the caller of token, and returns
// its output and exit code.
func ctl(ctx context.Context, t *testing.T, socket, token string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, informerctlBin.build(t), append([]string{"-address", socket, "-token-file", token}, args...)...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// ctlProc is a running informerctl whose stdout is read line by line.
type ctlProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  chan string // closed at EOF
	stderr strings.Builder
}

// startCtl starts informerctl with args (connection flags included).
func startCtl(t *testing.T, name string, args ...string) *ctlProc {
	t.Helper()
	p := &ctlProc{t: t, cmd: exec.Command(name, args...), lines: make(chan string, 1024)}
	p.cmd.Stderr = &p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { // ends at EOF: when the process exits
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); p.wait() })
	return p
}

// next returns the lines up to and including the first that match holds
// for; it fails the test if the output ends first or ctx does.
func (p *ctlProc) next(ctx context.Context, what string, match func(string) bool) []string {
	p.t.Helper()
	var got []string
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("%s: informerctl ended first; it printed %q, stderr %q", what, got, p.stderr.String())
			}
			got = append(got, l)
			if match(l) {
				return got
			}
		case <-ctx.Done():
			p.t.Fatalf("%s: %v; informerctl printed %q", what, ctx.Err(), got)
		}
	}
}

// interrupt stops the process as Ctrl-C does and returns its exit code.
func (p *ctlProc) interrupt() int {
	p.t.Helper()
	_ = p.cmd.Process.Signal(os.Interrupt)
	return p.wait()
}

func (p *ctlProc) wait() int {
	for range p.lines { // the rest of the output: Wait closes the pipe
	}
	_ = p.cmd.Wait()
	return p.cmd.ProcessState.ExitCode()
}

var deployments = schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}

// TestInformerctlGet: `get` lists (NAME/AGE table, NAMESPACE with -A,
// wide, json, yaml, name, -l) and gets by name from the daemon; a cluster-
// scoped resource ignores -n; RESOURCE.GROUP takes the preferred version;
// missing objects, unknown resources, forbidden namespaces and usage
// mistakes exit 1 or 2 with a message saying what to do.
func TestInformerctlGet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "ctl-get")
	other := createNamespace(ctx, t, "ctl-other")
	createConfigMap(ctx, t, ns, "web-config", map[string]string{"k": "v"})
	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	cm := createConfigMap(ctx, t, ns, "labelled", nil)
	cm.Labels = map[string]string{"app": ns} // unique: -A sees other tests' objects
	if _, err := admin.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, cache.Options{})
	mine := tokenFile(t, reads(configMaps, ns), reads(deployments, ns))
	all := tokenFile(t, readsAll)
	run := func(token string, args ...string) (string, string, int) {
		t.Helper()
		return ctl(ctx, t, d.socket, token, args...)
	}
	want := func(what string, gotOut, gotErr string, code, wantCode int, wantOut ...string) {
		t.Helper()
		if code != wantCode {
			t.Fatalf("%s: exit %d, want %d; stdout %q, stderr %q", what, code, wantCode, gotOut, gotErr)
		}
		for _, w := range wantOut {
			if !strings.Contains(gotOut+gotErr, w) {
				t.Fatalf("%s: output does not contain %q:\nstdout %q\nstderr %q", what, w, gotOut, gotErr)
			}
		}
	}

	out, errOut, code := run(mine, "get", "configmaps", "-n", ns)
	want("table", out, errOut, code, 0)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 || !regexp.MustCompile(`^NAME +AGE$`).MatchString(lines[0]) ||
		!regexp.MustCompile(`^kube-root-ca\.crt +[0-9]+[smhd]`).MatchString(lines[1]) || !strings.HasPrefix(lines[2], "labelled ") || !strings.HasPrefix(lines[3], "web-config ") {
		t.Fatalf("table:\n%s", out)
	}
	if col := strings.Index(lines[0], "AGE"); strings.Index(lines[3], strings.Fields(lines[3])[1]) != col {
		t.Fatalf("AGE is not one column:\n%s", out)
	}

	out, errOut, code = run(mine, "get", "configmaps", "-n", ns, "-l", "app="+ns, "-o", "name")
	want("-l -o name", out, errOut, code, 0)
	if out != "configmap/labelled\n" {
		t.Fatalf("-l app=%s -o name printed %q", ns, out)
	}
	out, errOut, code = run(mine, "get", "configmaps", "-n", ns, "-o", "wide", "-l", "app")
	want("wide", out, errOut, code, 0)
	if f := strings.Fields(strings.Split(out, "\n")[1]); len(f) != 4 || f[0] != "labelled" || f[3] != "app="+ns || !slices.Equal(strings.Fields(strings.Split(out, "\n")[0]), []string{"NAME", "AGE", "RESOURCEVERSION", "LABELS"}) {
		t.Fatalf("wide:\n%s", out)
	}
	out, errOut, code = run(mine, "get", "configmaps", "web-config", "-n", ns, "-o", "json")
	want("json by name", out, errOut, code, 0)
	var obj struct {
		Kind     string            `json:"kind"`
		Metadata metav1.ObjectMeta `json:"metadata"`
		Data     map[string]string `json:"data"`
	}
	if err := json.Unmarshal([]byte(out), &obj); err != nil || obj.Kind != "ConfigMap" || obj.Metadata.Name != "web-config" || obj.Data["k"] != "v" {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	out, errOut, code = run(mine, "get", "-o", "yaml", "configmaps", "-n", ns, "web-config")
	want("yaml by name, flags first", out, errOut, code, 0, "kind: ConfigMap\n", "  name: web-config\n", "  k: v\n")

	out, errOut, code = run(mine, "get", "configmaps", "web-config", "missing", "-n", ns, "-o", "name")
	want("a missing name", out, errOut, code, 1, "configmap/web-config\n", `Error from server (NotFound): object not found: configmaps "missing" in namespace `+ns)

	out, errOut, code = run(mine, "get", "deployments.apps", "-n", ns)
	want("RESOURCE.GROUP, none there", out, errOut, code, 0, "No resources found in "+ns+" namespace.")
	out, errOut, code = run(mine, "get", "deployments.v1.apps", "-n", ns, "-o", "json")
	want("RESOURCE.VERSION.GROUP as json", out, errOut, code, 0, `"kind": "List"`, `"items": []`)
	// Short names and kinds resolve in the daemon, before authorization:
	// the caller may read configmaps and deployments, nothing else.
	out, errOut, code = run(mine, "get", "cm", "labelled", "-n", ns, "-o", "name")
	want("a short name", out, errOut, code, 0)
	if out != "configmap/labelled\n" {
		t.Fatalf("get cm labelled printed %q", out)
	}
	out, errOut, code = run(mine, "get", "Deployment", "-n", ns)
	want("a kind", out, errOut, code, 0, "No resources found in "+ns+" namespace.")
	out, errOut, code = run(mine, "get", "deploy.apps", "-n", ns)
	want("a short name with its group", out, errOut, code, 0, "No resources found in "+ns+" namespace.")
	out, errOut, code = run(mine, "get", "po", "-n", ns)
	want("a short name of a resource the caller may not read", out, errOut, code, 1, "Error from server (PermissionDenied):", "pods")

	out, errOut, code = run(all, "get", "configmaps", "-A", "-l", "app="+ns)
	want("-A", out, errOut, code, 0)
	if l := strings.Split(out, "\n"); len(l) != 3 || !slices.Equal(strings.Fields(l[0]), []string{"NAMESPACE", "NAME", "AGE"}) || !strings.HasPrefix(l[1], ns+" ") {
		t.Fatalf("-A table:\n%s", out)
	}
	out, errOut, code = run(all, "get", "namespaces", ns, "-o", "name", "-n", other)
	want("a cluster-scoped resource ignores -n", out, errOut, code, 0)
	if out != "namespace/"+ns+"\n" {
		t.Fatalf("get namespaces %s printed %q", ns, out)
	}

	out, errOut, code = run(mine, "get", "configmaps", "-n", other)
	want("another namespace", out, errOut, code, 1, "Error from server (PermissionDenied):", "may not", "Grant the caller's ServiceAccount")
	out, errOut, code = run(mine, "get", "widgets.example.com", "-n", ns)
	want("an unknown resource", out, errOut, code, 1, "Error from server (NotFound):", "widgets", "Name the resource as RESOURCE[.VERSION][.GROUP]")
	out, errOut, code = run(filepath.Join(t.TempDir(), "absent"), "get", "configmaps", "-n", ns)
	want("no token", out, errOut, code, 1, "Error from server (Unauthenticated):", "-token-file")
	for _, args := range [][]string{
		{"get"}, {"get", "configmaps", "-o", "table"}, {"get", "configmaps", "x", "-A"}, {"get", ".apps"}, {"get", "configmaps", "-bogus"}, {"gte", "configmaps"},
	} {
		out, errOut, code = run(mine, args...)
		want(strings.Join(args, " "), out, errOut, code, 2, "error: ", "See 'informerctl")
	}
}

// TestInformerctlWatch: `watch` prints the snapshot, SYNCED, then every
// change with its event, as JSON lines and as a table whose rows line up;
// Ctrl-C exits 0; an unknown resource or a forbidden namespace exits 1.
func TestInformerctlWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "ctl-watch")
	createConfigMap(ctx, t, ns, "first", nil)
	d := startDaemon(t, cache.Options{})
	token := tokenFile(t, reads(configMaps, ns))
	bin := informerctlBin.build(t)

	type event struct {
		Type   string `json:"type"`
		Object struct {
			Metadata metav1.ObjectMeta `json:"metadata"`
			Data     map[string]string `json:"data"`
		} `json:"object"`
	}
	parse := func(l string) event {
		var ev event
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("not a JSON line: %q: %v", l, err)
		}
		return ev
	}
	isType := func(typ, name string) func(string) bool {
		return func(l string) bool { ev := parse(l); return ev.Type == typ && ev.Object.Metadata.Name == name }
	}
	js := startCtl(t, bin, "-address", d.socket, "-token-file", token, "watch", "configmaps", "-n", ns, "-o", "json", "-client-name", "ctl-json")
	snapshot := js.next(ctx, "SYNCED", func(l string) bool { return parse(l).Type == "SYNCED" })
	var names []string
	for _, l := range snapshot[:len(snapshot)-1] {
		if ev := parse(l); ev.Type == "ADDED" {
			names = append(names, ev.Object.Metadata.Name)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"first", "kube-root-ca.crt"}) {
		t.Fatalf("snapshot %q", snapshot)
	}
	table := startCtl(t, bin, "-address", d.socket, "-token-file", token, "watch", "configmaps", "-n", ns)
	head := table.next(ctx, "the table's SYNCED", func(l string) bool { return l == "SYNCED" })

	admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
	cm := createConfigMap(ctx, t, ns, "a-much-longer-name-than-the-others", nil)
	js.next(ctx, "ADDED", isType("ADDED", cm.Name))
	cm.Data = map[string]string{"k": "v"}
	if _, err := admin.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := parse(js.next(ctx, "MODIFIED", isType("MODIFIED", cm.Name))[0]); ev.Object.Data["k"] != "v" {
		t.Fatalf("MODIFIED carries %v", ev.Object.Data)
	}
	if err := admin.CoreV1().ConfigMaps(ns).Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	js.next(ctx, "DELETED", isType("DELETED", cm.Name))
	if code := js.interrupt(); code != 0 {
		t.Fatalf("Ctrl-C: exit %d, stderr %q", code, js.stderr.String())
	}

	rows := table.next(ctx, "the table's DELETED", func(l string) bool { return strings.HasPrefix(l, "DELETED") })
	if code := table.interrupt(); code != 0 {
		t.Fatalf("Ctrl-C: exit %d", code)
	}
	all := append(head, rows...)
	if !regexp.MustCompile(`^EVENT +NAME +AGE$`).MatchString(all[0]) || len(rows) != 3 ||
		!strings.HasPrefix(rows[0], "ADDED ") || !strings.HasPrefix(rows[1], "MODIFIED ") || !strings.HasPrefix(rows[2], "DELETED ") {
		t.Fatalf("table:\n%s", strings.Join(all, "\n"))
	}
	nameCol := strings.Index(all[0], "NAME")
	for _, l := range all[1:] {
		if l != "SYNCED" && (len(l) <= nameCol || l[nameCol-1] != ' ' || l[nameCol] == ' ') {
			t.Fatalf("NAME is not one column in:\n%s", strings.Join(all, "\n"))
		}
	}

	out, errOut, code := ctl(ctx, t, d.socket, token, "watch", "widgets.example.com", "-n", ns)
	if code != 1 || !strings.Contains(errOut, "Error from server (NotFound)") {
		t.Fatalf("unknown resource: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = ctl(ctx, t, d.socket, token, "watch", "configmaps", "-A")
	if code != 1 || !strings.Contains(errOut, "Error from server (PermissionDenied)") || out != "" {
		t.Fatalf("all namespaces, allowed one: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestInformerctlInformersWatch: `informers` lists each informer with its
// holders and events; `-w` on a non-terminal prints a new table per
// refresh, with the event rate measured between refreshes, and in a
// pseudo-terminal redraws the table in place.
func TestInformerctlInformersWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "ctl-informers")
	d := startDaemon(t, cache.Options{})
	holder := newRecorder()
	runWatcher(t, d.dial(t, reads(configMaps, ns)), client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "rate-holder"}, holder)
	<-holder.synced
	token := tokenFile(t, introspects)
	bin := informerctlBin.build(t)

	out, errOut, code := ctl(ctx, t, d.socket, token, "informers")
	if code != 0 || !regexp.MustCompile(`(?m)^RESOURCE +NAMESPACE +STATE +REFS +OBJECTS +RV +LAG +EVENTS +HOLDERS +CALLERS`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^configmaps\.v1 +(\*|`+ns+`) +synced +1 +\d+ +\d+ +0 +\d+ +rate-holder +system:serviceaccount:`).MatchString(out) {
		t.Fatalf("informers: exit %d, stderr %q:\n%s", code, errOut, out)
	}

	// A load generator: a new ConfigMap every 20ms while the test runs.
	load, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		admin := kubernetes.NewForConfigOrDie(env.RESTConfig())
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for i := 0; load.Err() == nil; i++ {
			_, _ = admin.CoreV1().ConfigMaps(ns).Create(load, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("load-%d", i)}}, metav1.CreateOptions{})
			select {
			case <-load.Done():
			case <-tick.C:
			}
		}
	}()
	defer func() { stopLoad(); <-loaded }()

	row := regexp.MustCompile(`^configmaps\.v1 +(\*|` + ns + `) +synced +1 +(\d+) +\d+ +\d+ +(\d+) +(\S+) +rate-holder `)
	p := startCtl(t, bin, "-address", d.socket, "-token-file", token, "informers", "-w", "-interval", "300ms")
	var tables, positive int
	p.next(ctx, "two tables with a positive rate", func(l string) bool {
		switch {
		case strings.HasPrefix(l, "RESOURCE "):
			tables++
			if !strings.Contains(l, " EVENTS   RATE ") {
				t.Fatalf("-w header without RATE: %q", l)
			}
		case row.MatchString(l):
			m := row.FindStringSubmatch(l)
			if tables == 1 && m[4] != "-" {
				t.Fatalf("the first table has a rate: %q", l)
			}
			if r, err := strconv.ParseFloat(strings.TrimSuffix(m[4], "/s"), 64); err == nil && r > 0 {
				positive++
			}
		}
		return positive >= 2
	})
	if code := p.interrupt(); code != 0 || tables < 3 {
		t.Fatalf("-w: exit %d after %d tables; stderr %q", code, tables, p.stderr.String())
	}

	script, err := exec.LookPath("script")
	if err != nil {
		t.Log("no script(1): the pseudo-terminal case is not run")
		return
	}
	cmd := fmt.Sprintf("%s -address %s -token-file %s informers -w -interval 200ms", bin, d.socket, token)
	tty := startCtl(t, script, "-qfec", cmd, "/dev/null")
	redraw := regexp.MustCompile(`\x1b\[\d+F\x1b\[J`)
	tty.next(ctx, "a redraw in place", func(l string) bool { return redraw.MatchString(l) && strings.Contains(l, "RESOURCE ") })
	_ = tty.cmd.Process.Signal(syscall.SIGTERM)
}

// TestInformerctlVersion: `version` prints informerctl's version and the
// daemon's (from the Version RPC), as text and JSON; without a token the
// client's is printed and the exit code is 1 with what to do.
func TestInformerctlVersion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := startDaemon(t, cache.Options{})
	token := tokenFile(t) // any authenticated caller
	out, errOut, code := ctl(ctx, t, d.socket, token, "version")
	want := fmt.Sprintf(`^Client Version: \S+ \(go1\.\d+.*\)\nServer Version: %s \(go1\.\d+.*\)\n$`, regexp.QuoteMeta(version.Version))
	if code != 0 || !regexp.MustCompile(want).MatchString(out) {
		t.Fatalf("version: exit %d, stderr %q:\n%s", code, errOut, out)
	}
	out, _, code = ctl(ctx, t, d.socket, token, "version", "-o", "json")
	var v struct {
		Client struct{ Version string } `json:"clientVersion"`
		Server struct{ Version string } `json:"serverVersion"`
	}
	if err := json.Unmarshal([]byte(out), &v); code != 0 || err != nil || v.Server.Version != version.Version || v.Client.Version == "" {
		t.Fatalf("version -o json: exit %d, %v:\n%s", code, err, out)
	}
	out, errOut, code = ctl(ctx, t, d.socket, filepath.Join(t.TempDir(), "absent"), "version")
	if code != 1 || !strings.HasPrefix(out, "Client Version: ") || strings.Contains(out, "Server") || !strings.Contains(errOut, "Error from server (Unauthenticated)") {
		t.Fatalf("version without a token: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = ctl(ctx, t, filepath.Join(t.TempDir(), "none.sock"), token, "version")
	if code != 1 || !strings.Contains(errOut, "does not exist: is informerd running on this node") {
		t.Fatalf("version without a daemon: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestInformerctlCompletion: the bash script completes commands, flags
// and -o's values as bash runs it; zsh's and fish's name every command.
func TestInformerctlCompletion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin := informerctlBin.build(t)
	script, err := exec.CommandContext(ctx, bin, "completion", "bash").Output()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "informerctl.bash")
	if err := os.WriteFile(path, script, 0o600); err != nil {
		t.Fatal(err)
	}
	complete := func(words ...string) string {
		t.Helper()
		quoted := make([]string, len(words))
		for i, w := range words {
			quoted[i] = strconv.Quote(w)
		}
		sh := fmt.Sprintf(`source %s; COMP_WORDS=(%s); COMP_CWORD=%d; _informerctl; echo "${COMPREPLY[*]}"`, path, strings.Join(quoted, " "), len(words)-1)
		out, err := exec.CommandContext(ctx, "bash", "--norc", "-c", sh).CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tc := range []struct {
		words []string
		want  string
	}{
		{[]string{"informerctl", "g"}, "get"},
		{[]string{"informerctl", "-address", "/run/x.sock", "w"}, "watch"},
		{[]string{"informerctl", "get", "configmaps", "-o", ""}, "wide json yaml name"},
		{[]string{"informerctl", "version", "-o", ""}, "json yaml"},
		{[]string{"informerctl", "get", "-sel"}, "-selector"},
		{[]string{"informerctl", "informers", "-int"}, "-interval"},
		{[]string{"informerctl", "completion", "f"}, "fish"},
		{[]string{"informerctl", "-tok"}, "-token-file"},
	} {
		if got := complete(tc.words...); got != tc.want {
			t.Errorf("completing %q: %q, want %q", tc.words, got, tc.want)
		}
	}
	for _, shell := range []string{"zsh", "fish"} {
		out, err := exec.CommandContext(ctx, bin, "completion", shell).Output()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{"informers", "get", "watch", "address", "status", "version", "completion"} {
			if !strings.Contains(string(out), c) {
				t.Errorf("the %s script does not name %s", shell, c)
			}
		}
	}
	var exit *exec.ExitError
	if err := exec.CommandContext(ctx, bin, "completion", "ksh").Run(); !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("completion ksh: %v, want exit 2", err)
	}
}

// TestDaemonJSONLogsCarryStreamAndCaller: with -log-format json every line
// informerd writes is a JSON object, and a stream's lines carry its stream
// id and its caller's identity.
func TestDaemonJSONLogsCarryStreamAndCaller(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "json-logs")
	logs := &syncBuffer{}
	d := startDaemonProcessTo(t, filepath.Join(t.TempDir(), "informerd.sock"), logs, "-log-format", "json", "-log-level", "debug")
	saNS, saName := newServiceAccount(t)
	grant(t, saNS, saName, reads(configMaps, ns))
	c := dialWith(t, d.socket, client.WithToken(mintToken(t, saNS, saName, "informerd")))
	s, err := c.Stream(ctx, client.WatchOptions{Resource: configMaps, Namespace: ns, ClientName: "json-log-client"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	caller := "system:serviceaccount:" + saNS + ":" + saName
	var started, ended map[string]any
	eventually(ctx, t, "the stream's first and last lines", func() bool {
		started, ended = nil, nil
		for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("not a JSON line: %q", l)
			}
			switch {
			case m["msg"] == "stream started" && m["client"] == "json-log-client":
				started = m
			case started != nil && m["msg"] == "request ended" && m["stream"] == started["stream"]:
				ended = m
			}
		}
		return started != nil && ended != nil
	})
	if _, ok := started["stream"].(float64); !ok || started["caller"] != caller || ended["caller"] != caller || ended["code"] != "Canceled" {
		t.Fatalf("stream lines without stream id or caller %s:\n%v\n%v", caller, started, ended)
	}
}

// syncBuffer is a strings.Builder safe for a process's output and a test.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var _ io.Writer = (*syncBuffer)(nil)

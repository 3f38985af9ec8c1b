package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestExitCodes: usage mistakes exit 2 naming the mistake and where help
// is, -h exits 0 with the usage on stdout; none of them dials.
func TestExitCodes(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{nil, exitUsage, "error: missing command: one of informers, get, watch"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"-bogus"}, exitUsage, "flag provided but not defined: -bogus\nSee 'informerctl -h' for usage."},
		{[]string{"get"}, exitUsage, "missing RESOURCE, for example configmaps or deployments.apps\nSee 'informerctl get -h' for usage."},
		{[]string{"get", "pods", "-o", "table"}, exitUsage, `-o "table": want wide, json, yaml or name`},
		{[]string{"get", "pods", "x", "-A"}, exitUsage, "across all namespaces"},
		{[]string{"get", "pods", "x", "-l", "a=b"}, exitUsage, "not both"},
		{[]string{"watch"}, exitUsage, "missing RESOURCE"},
		{[]string{"watch", "pods", "services"}, exitUsage, "watch takes one resource"},
		{[]string{"informers", "extra"}, exitUsage, "informers takes flags only"},
		{[]string{"informers", "-interval", "0s"}, exitUsage, "-interval 0s: must be positive"},
		{[]string{"version", "-o", "name"}, exitUsage, `want json or yaml`},
		{[]string{"address", "10.0.0.1"}, exitUsage, "want IP:PORT"},
		{[]string{"status"}, exitUsage, "-f is required"},
		{[]string{"completion"}, exitUsage, "want one shell"},
		{[]string{"-h"}, exitOK, ""},
		{[]string{"get", "-h"}, exitOK, ""},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errOut bytes.Buffer
			e := &env{stdout: &out, stderr: &errOut, conn: defaultConn}
			e.conn.address = "/nonexistent/informerd.sock"
			if code := run(context.Background(), tt.args, e); code != tt.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tt.code, errOut.String())
			}
			if !strings.Contains(errOut.String(), tt.stderr) {
				t.Fatalf("stderr %q, want it to contain %q", errOut.String(), tt.stderr)
			}
			if tt.code == exitOK && !strings.Contains(out.String(), "Usage: informerctl") {
				t.Fatalf("-h printed %q", out.String())
			}
		})
	}
}

// TestParseInterspersed: flags go before, between and after positional
// arguments; "--" ends them.
func TestParseInterspersed(t *testing.T) {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := fs.String("n", "", "")
	o := fs.String("o", "", "")
	pos, err := parseInterspersed(fs, []string{"-n", "ns", "pods", "-o", "json", "a", "--", "-b"})
	if err != nil || *n != "ns" || *o != "json" || strings.Join(pos, ",") != "pods,a,-b" {
		t.Fatalf("positional %q, -n %q, -o %q, %v", pos, *n, *o, err)
	}
}

func TestParseResource(t *testing.T) {
	for in, want := range map[string]schema.GroupVersionResource{
		"configmaps":                        {Resource: "configmaps"},
		"deployments.apps":                  {Group: "apps", Resource: "deployments"},
		"deployments.v1.apps":               {Group: "apps", Version: "v1", Resource: "deployments"},
		"pods.v1":                           {Version: "v1", Resource: "pods"},
		"widgets.v1beta2.example.com":       {Group: "example.com", Version: "v1beta2", Resource: "widgets"},
		"ingresses.networking.k8s.io":       {Group: "networking.k8s.io", Resource: "ingresses"},
		"servers.v1beta3.policy.linkerd.io": {Group: "policy.linkerd.io", Version: "v1beta3", Resource: "servers"},
		"cm":                                {Resource: "cm"},
		"Deployment.apps":                   {Group: "apps", Resource: "deployment"},
	} {
		if got, err := parseResource(in); err != nil || got != want {
			t.Errorf("parseResource(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ".apps"} {
		if _, err := parseResource(bad); err == nil {
			t.Errorf("parseResource(%q) accepted it", bad)
		}
	}
}

// TestTable: columns as wide as their widest cell, 3 spaces apart, no
// trailing spaces; later rows keep the widths.
func TestTable(t *testing.T) {
	var tb table
	var b strings.Builder
	_ = tb.print(&b, []string{"NAME", "AGE", "LABELS"}, []string{"a-long-name", "5m", ""})
	_ = tb.print(&b, []string{"b", "10d", "x=y"})
	want := "NAME          AGE   LABELS\na-long-name   5m\nb             10d   x=y\n"
	if b.String() != want {
		t.Fatalf("table\n%q, want\n%q", b.String(), want)
	}
}

func testObject(apiVersion, kind, ns, name string, created time.Time, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetResourceVersion("42")
	u.SetCreationTimestamp(metav1.NewTime(created))
	u.SetLabels(labels)
	return u
}

// TestWatchPrinter: each output format of watch, the table's snapshot
// printed at SYNCED with the rows lined up, later rows in its columns.
func TestWatchPrinter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := testObject("apps/v1", "Deployment", "ns", "a", now.Add(-90*time.Second), nil)
	long := testObject("apps/v1", "Deployment", "other", "much-longer", now.Add(-3*time.Hour), map[string]string{"app": "x"})
	feed := func(format string, all bool) string {
		var b strings.Builder
		p := newWatchPrinter(&b, format, all, func() time.Time { return now })
		p.OnAdd(a, true)
		p.OnAdd(long, true)
		p.OnSynced()
		p.OnUpdate(a, a)
		p.OnDelete(long)
		return b.String()
	}
	for _, tt := range []struct {
		format string
		all    bool
		want   string
	}{
		{outputTable, false, "EVENT      NAME          AGE\nADDED      a             90s\nADDED      much-longer   3h\nSYNCED\nMODIFIED   a             90s\nDELETED    much-longer   3h\n"},
		{outputTable, true, "EVENT      NAMESPACE   NAME          AGE\nADDED      ns          a             90s\nADDED      other       much-longer   3h\nSYNCED\nMODIFIED   ns          a             90s\nDELETED    other       much-longer   3h\n"},
		{outputWide, false, "EVENT      NAME          AGE   RESOURCEVERSION   LABELS\nADDED      a             90s   42                <none>\nADDED      much-longer   3h    42                app=x\nSYNCED\nMODIFIED   a             90s   42                <none>\nDELETED    much-longer   3h    42                app=x\n"},
		{outputName, false, "ADDED deployment.apps/a\nADDED deployment.apps/much-longer\nSYNCED\nMODIFIED deployment.apps/a\nDELETED deployment.apps/much-longer\n"},
	} {
		if got := feed(tt.format, tt.all); got != tt.want {
			t.Errorf("-o %q (all %v):\n%s\nwant\n%s", tt.format, tt.all, got, tt.want)
		}
	}
	js := strings.Split(strings.TrimSpace(feed(outputJSON, false)), "\n")
	if len(js) != 5 || !strings.HasPrefix(js[0], `{"object":{"apiVersion":"apps/v1","kind":"Deployment","metadata":{`) || !strings.HasSuffix(js[0], `},"type":"ADDED"}`) || js[2] != `{"type":"SYNCED"}` {
		t.Errorf("-o json:\n%s", strings.Join(js, "\n"))
	}
	if y := feed(outputYAML, false); strings.Count(y, "---\n") != 5 || !strings.Contains(y, "---\ntype: SYNCED\n") || !strings.Contains(y, "type: DELETED\n") {
		t.Errorf("-o yaml:\n%s", y)
	}
}

// TestInformerRows: the RATE column is the events per second between two
// readings; "-" for a first reading or a counter that went back.
func TestInformerRows(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	inf := func(events uint64) []*informerdv1.Informer {
		return []*informerdv1.Informer{{
			Resource: &informerdv1.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, Namespace: "ns",
			State: "synced", RefCount: 2, Objects: 7, ResourceVersion: "99", MaxLagEvents: 1, EventsIn: events, Holders: []string{"a", "b"},
			Subscribers: []*informerdv1.Subscriber{{User: "u", Peer: "uid:1"}, {User: "u", Peer: "uid:1"}},
		}}
	}
	rows, prev := informerRows(inf(100), nil, t0, true)
	want := []string{"deployments.v1.apps", "ns", "synced", "2", "7", "99", "1", "100", "-", "a,b", "u (uid:1)", ""}
	if strings.Join(rows[1], "|") != strings.Join(want, "|") || rows[0][8] != "RATE" {
		t.Fatalf("first rows %q", rows)
	}
	rows, prev = informerRows(inf(130), prev, t0.Add(2*time.Second), true)
	if rows[1][8] != "15.0/s" {
		t.Fatalf("rate %q, want 15.0/s", rows[1][8])
	}
	if rows, _ = informerRows(inf(3), prev, t0.Add(4*time.Second), true); rows[1][8] != "-" {
		t.Fatalf("rate after a restart %q, want -", rows[1][8])
	}
	if rows, _ = informerRows(inf(3), nil, t0, false); len(rows[0]) != 11 || rows[0][7] != "EVENTS" || rows[0][8] != "HOLDERS" {
		t.Fatalf("without -w: %q", rows[0])
	}
}

// TestDescribeError: the daemon's answers as kubectl prints them, with
// what to do.
func TestDescribeError(t *testing.T) {
	notFound, _ := status.New(codes.NotFound, `object not found: configmaps "x" in namespace ns`).WithDetails(
		&errdetails.ErrorInfo{Domain: informerdv1.ErrorDomain, Reason: informerdv1.ReasonObjectNotFound})
	for _, tt := range []struct {
		err  error
		want string
	}{
		{notFound.Err(), "Error from server (NotFound): object not found: configmaps \"x\" in namespace ns"},
		{status.Error(codes.NotFound, "the API server does not serve widgets"), "Error from server (NotFound): the API server does not serve widgets\nName the resource as"},
		{status.Error(codes.PermissionDenied, "u may not list"), "Error from server (PermissionDenied): u may not list\nGrant"},
		{status.Error(codes.Unauthenticated, "no token"), "Error from server (Unauthenticated): no token\nThe daemon did not accept the caller's token: pass -token-file"},
		{status.Error(codes.Unavailable, "connection refused"), "error: informerd at /nonexistent/x.sock is unavailable: connection refused\nThe socket /nonexistent/x.sock does not exist"},
		{status.Error(codes.Unimplemented, "unknown method Version"), "older than informerctl"},
		{io.ErrUnexpectedEOF, "error: unexpected EOF"},
	} {
		if got := describeError(tt.err, "/nonexistent/x.sock"); !strings.HasPrefix(got, tt.want) && !strings.Contains(got, tt.want) {
			t.Errorf("describeError(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
	if got := describeError(notFound.Err(), "/x"); strings.Contains(got, "\n") {
		t.Errorf("an object not found has a hint: %q", got)
	}
}

// TestInformersRedraw: on a terminal, -w redraws the table in place: it
// moves up over the previous one, whose lines are cut to the terminal's
// width so that each took one row.
func TestInformersRedraw(t *testing.T) {
	var b strings.Builder
	v := &informersView{out: &b, watch: true, terminal: true, width: func() int { return 20 }}
	infs := []*informerdv1.Informer{{Resource: &informerdv1.GroupVersionResource{Version: "v1", Resource: "configmaps"}, State: "synced"}}
	now := time.Now()
	for i := range 2 {
		if err := v.draw(infs, now.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	out := b.String()
	first, second, ok := strings.Cut(out, "\x1b[2F\x1b[J")
	if !ok || first != "RESOURCE        NAME\nconfigmaps.v1   *   \n" || second != first {
		t.Fatalf("terminal output %q: want a 2-line table cut to 20 columns, then the same redrawn over it", out)
	}
}

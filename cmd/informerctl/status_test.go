package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/object"
)

const manifests = `apiVersion: v1
kind: Namespace
metadata: {name: app}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: app}
---
# a comment-only document
---
apiVersion: v1
kind: ConfigMap
metadata: {name: config}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: globals.example.com}
spec: {group: example.com, scope: Cluster, names: {kind: Global, plural: globals}}
---
apiVersion: example.com/v1
kind: Global
metadata: {name: g}
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Service, metadata: {name: web, namespace: app}}
- {apiVersion: apps/v1, kind: Deployment, metadata: {name: web, namespace: app}}
`

// TestReadManifests: documents, Lists, duplicates; objects without a
// namespace take the default one unless their kind is cluster-scoped (built
// in, or by a CRD among the manifests); directories read every manifest
// file in name order.
func TestReadManifests(t *testing.T) {
	want := []string{
		"Namespace app", "Deployment.apps app/web", "ConfigMap dflt/config",
		"CustomResourceDefinition.apiextensions.k8s.io globals.example.com", "Global.example.com g", "Service app/web",
	}
	check := func(ids object.ObjMetadataSet, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, id := range ids {
			got = append(got, describe(id))
		}
		if strings.Join(got, "; ") != strings.Join(want, "; ") {
			t.Fatalf("objects\n%q, want\n%q", got, want)
		}
	}
	check(readManifests("-", strings.NewReader(manifests), "dflt"))

	dir := t.TempDir()
	parts := strings.SplitN(manifests, "---\n", 3)
	for name, content := range map[string]string{"a.yaml": parts[0], "b.yml": parts[1], "c.json": "", "d.yaml": parts[2], "notes.txt": "not a manifest"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	check(readManifests(dir, nil, "dflt"))

	if _, err := readManifests("-", strings.NewReader("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n"), "x"); err == nil || !strings.Contains(err.Error(), "document 1: an object needs a kind and a metadata.name") {
		t.Fatalf("a nameless object: %v", err)
	}
	if _, err := readManifests(t.TempDir(), nil, "x"); err == nil || !strings.Contains(err.Error(), "holds no") {
		t.Fatalf("an empty directory: %v", err)
	}
}

func rs(name string, s kstatus.Status, msg string) event.Event {
	return event.Event{Type: event.ResourceUpdateEvent, Resource: &event.ResourceStatus{
		Identifier: object.ObjMetadata{GroupKind: schema.GroupKind{Group: "apps", Kind: "Deployment"}, Namespace: "ns", Name: name},
		Status:     s, Message: msg,
	}}
}

func feed(evs ...event.Event) <-chan event.Event {
	ch := make(chan event.Event, len(evs))
	for _, ev := range evs {
		ch <- ev
	}
	close(ch)
	return ch
}

// TestStatusViewExits: the view succeeds once synced with every object
// Current, and otherwise fails naming the objects that are not; plain
// output has one line per change.
func TestStatusViewExits(t *testing.T) {
	ids := object.ObjMetadataSet{rs("a", "", "").Resource.Identifier, rs("b", "", "").Resource.Identifier}
	var out bytes.Buffer
	v := newStatusView(&out, false, ids)
	err := v.run(context.Background(), feed(rs("a", kstatus.InProgressStatus, "rolling out"), rs("b", kstatus.CurrentStatus, "ok"),
		event.Event{Type: event.SyncEvent}, rs("a", kstatus.CurrentStatus, "done"), rs("b", kstatus.InProgressStatus, "never seen")))
	if err != nil {
		t.Fatalf("all Current: %v", err)
	}
	want := "InProgress\tDeployment.apps ns/a\trolling out\nCurrent\tDeployment.apps ns/b\tok\nSYNCED\nCurrent\tDeployment.apps ns/a\tdone\n"
	if out.String() != want {
		t.Fatalf("output\n%q, want\n%q", out.String(), want)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	v = newStatusView(&bytes.Buffer{}, false, ids)
	err = v.run(ctx, feed(rs("a", kstatus.InProgressStatus, "rolling out"), event.Event{Type: event.SyncEvent}))
	if err == nil || !strings.Contains(err.Error(), "2 objects not Current: Deployment.apps ns/a (InProgress: rolling out), Deployment.apps ns/b (no status yet)") {
		t.Fatalf("stopped early: %v", err)
	}

	var term bytes.Buffer
	v = newStatusView(&term, true, ids)
	if err := v.run(context.Background(), feed(rs("a", kstatus.CurrentStatus, "ok"), event.Event{Type: event.SyncEvent}, rs("b", kstatus.CurrentStatus, "ok"))); err != nil {
		t.Fatal(err)
	}
	if tables := strings.Count(term.String(), "STATUS"); tables < 2 || !strings.Contains(term.String(), "\x1b[3F\x1b[J") {
		t.Fatalf("terminal output does not redraw its 3-line table in place:\n%q", term.String())
	}
}

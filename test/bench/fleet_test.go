package main

import (
	"testing"
)

// TestMapDiff: "lost" counts every object a consumer's store holds at
// another resourceVersion, lacks, or holds though the API server does not.
func TestMapDiff(t *testing.T) {
	api := map[string]string{"pods/a/x": "5", "pods/a/y": "7", "pods/a/z": "9"}
	store := map[string]string{"pods/a/x": "5", "pods/a/y": "6", "pods/a/gone": "3"}
	if got := mapDiff(store, api); got != 3 { // y stale, z missing, gone extra
		t.Fatalf("mapDiff = %d, want 3", got)
	}
	if got := mapDiff(api, api); got != 0 {
		t.Fatalf("mapDiff of equal stores = %d, want 0", got)
	}
}

// TestFleetScopes: each consumer is compared with, and probed through,
// exactly what it watches.
func TestFleetScopes(t *testing.T) {
	tr := truth{
		podsByNode:     map[string]map[string]string{fleetNodeName(3): {"pods/fleet-3/p": "1"}},
		cluster:        map[string]string{"services/fleet-0/s": "2"},
		configMapsByNS: map[string]map[string]string{fleetNamespace(13): {"configmaps/fleet-3/c": "3"}},
	}
	for _, tc := range []struct {
		role  string
		node  int
		want  string
		probe string
	}{
		{"agent-1", 3, "pods/fleet-3/p", probePodKey(3)},
		{"proxy-0", 3, "services/fleet-0/s", probeSliceKey},
		{"applier", 13, "configmaps/fleet-3/c", probeConfigMapKey(13)},
	} {
		if got := tr.scope(tc.role, tc.node); len(got) != 1 || got[tc.want] == "" {
			t.Errorf("%s of node %d is compared with %v, want %s", tc.role, tc.node, got, tc.want)
		}
		c := &consumer{node: tc.node, role: tc.role}
		if got := c.probeKeys(); len(got) != 1 || got[0] != tc.probe {
			t.Errorf("%s of node %d is probed with %v, want %s", tc.role, tc.node, got, tc.probe)
		}
	}
	if got := fleetWatches("agent-0", 7); len(got) != 1 || got[0].fieldSelector != "spec.nodeName="+fleetNodeName(7) {
		t.Errorf("a node agent watches %+v, want its node's Pods", got)
	}
}

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

// TestNodeEvents: the floor counts each node's events once per kind of
// consumer, whatever the number of consumers of that kind; a node's
// consumers together count every delivery.
func TestNodeEvents(t *testing.T) {
	before := []consumerState{{Node: 0, Role: "proxy-0", Events: 10}, {Node: 0, Role: "proxy-1", Events: 10}, {Node: 0, Role: "applier", Events: 5}, {Node: 1, Role: "proxy-0", Events: 0}}
	after := []consumerState{{Node: 0, Role: "proxy-0", Events: 110}, {Node: 0, Role: "proxy-1", Events: 109}, {Node: 0, Role: "applier", Events: 8}, {Node: 1, Role: "proxy-0", Events: 100}}
	all, floor := nodeEvents(before, after)
	if all != 100+99+3+100 || floor != 100+3+100 {
		t.Fatalf("nodeEvents = %v, %v; want 302 delivered, a floor of 203", all, floor)
	}
}

// TestMeshRoles: the mesh profile runs a proxy per Pod of the node, each
// watching every Service and EndpointSlice; the mix keeps its five.
func TestMeshRoles(t *testing.T) {
	mesh := fleetRoles(profileMesh, 30)
	if len(mesh) != 30 || roleKind(mesh[29]) != "proxy" || fleetSA(mesh[29]) != fleetSA("proxy-0") {
		t.Fatalf("mesh roles %v, want 30 proxies with the proxies' ServiceAccount", mesh)
	}
	if w := fleetWatches(mesh[17], 4); len(w) != 2 || w[0].gvr != servicesGVR || w[1].gvr != slicesGVR {
		t.Fatalf("a mesh proxy watches %+v, want every Service and EndpointSlice", w)
	}
	if got := fleetRoles(profileMix, 30); len(got) != 5 {
		t.Fatalf("mix roles %v, want 5", got)
	}
}

package main

import (
	"testing"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

func TestFormatAnswer(t *testing.T) {
	servers := &informerdv1.UnavailableKind{
		Resource: &informerdv1.GroupVersionResource{Group: "policy.linkerd.io", Version: "v1beta3", Resource: "servers"},
		Reason:   "servers.policy.linkerd.io is forbidden",
	}
	tests := []struct {
		name string
		a    *informerdv1.WatchAddressResponse
		want string
	}{
		{"no pod", &informerdv1.WatchAddressResponse{}, "no pod"},
		{"no pod, a kind unavailable", &informerdv1.WatchAddressResponse{Unavailable: []*informerdv1.UnavailableKind{servers}},
			`no pod unavailable=servers.policy.linkerd.io:"servers.policy.linkerd.io is forbidden"`},
		{"pod with its workload, a kind unavailable", &informerdv1.WatchAddressResponse{
			Pod: &informerdv1.AddressPod{
				Namespace: "ns", Name: "web-7c9-x", Uid: "u", Phase: "Running", Ready: true,
				Owner:    &informerdv1.PodOwner{ApiVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-7c9"},
				Workload: &informerdv1.PodOwner{ApiVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			},
			Match: informerdv1.AddressMatch_ADDRESS_MATCH_POD_IP, Claimants: 1,
			Unavailable: []*informerdv1.UnavailableKind{servers},
		}, `pod ns/web-7c9-x uid=u phase=Running ready=true match=pod_ip owner=ReplicaSet/web-7c9 workload=Deployment/web unavailable=servers.policy.linkerd.io:"servers.policy.linkerd.io is forbidden"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := formatAnswer(tt.a); got != tt.want {
				t.Fatalf("formatAnswer:\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

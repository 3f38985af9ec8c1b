package address

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Match says how the pod behind an address was found.
type Match uint8

// Matches.
const (
	// NoMatch: no pod is behind the address.
	NoMatch Match = iota
	// MatchPodIP: the address's IP is one of the pod's IPs.
	MatchPodIP
	// MatchHostPort: the address is a host IP of the pod and a hostPort it
	// declares.
	MatchHostPort
)

// Answer is who is behind an address. Answers are immutable and shared by
// every watcher of the address.
type Answer struct {
	// Pod is the pod behind the address; nil when no pod is.
	Pod   *Pod
	Match Match
	// Port is the pod's declared container port for the address; nil when
	// it declares none.
	Port *Port
	// Related are the related objects that select the pod and port, in the
	// order of Options.Related, then by namespace and name.
	Related []Related
	// Claimants is how many live pods claim the address (see the package
	// documentation for the rule that picks one).
	Claimants int
	// Workload is the pod's workload: its controller's controller through
	// a ReplicaSet or a Job (a Deployment, a CronJob), else its controller
	// (a StatefulSet, a DaemonSet, a ReplicaSet or Job that no one
	// controls); nil when the pod has no controller, when its ReplicaSet's
	// or Job's kind is Unavailable, and for a watch that did not ask
	// (Request.Workload).
	Workload *Owner
	// Unavailable are the related kinds whose objects the answer lacks,
	// and why, in the order of Options.Related, then ReplicaSets and Jobs
	// (for a watch that asked for the workload). Shared: do not modify.
	Unavailable []Unavailable
}

// Unavailable is a kind whose objects an answer lacks: the daemon cannot
// read it, or the watcher may not (Request.Withhold). What depends on
// other kinds is unaffected.
type Unavailable struct {
	Resource schema.GroupVersionResource
	// Reason says why, for a person.
	Reason string
}

// nobody is the answer for an address no pod is behind.
var nobody = &Answer{}

// Pod is what an answer carries of a pod, and what the indexes keep of it:
// nothing else of the pod is held.
type Pod struct {
	Namespace, Name, UID string
	// Labels are all the pod's labels, shared with the cache: do not
	// modify them.
	Labels map[string]string
	// Owner is the pod's controller; nil when it has none.
	Owner          *Owner
	ServiceAccount string
	// Phase is "Pending" or "Running": pods in other phases are no answer.
	Phase string
	// Ready is true when the pod is Running and its Ready condition is True.
	Ready bool

	created time.Time
	// ips are the pod IPs; none for a host-network pod.
	ips     []netip.Addr
	hostIPs []netip.Addr
	// ports are the declared container ports, containers in order, then
	// init containers (sidecars may serve).
	ports []Port
}

// Owner is a pod's controller, or its workload.
type Owner struct {
	APIVersion, Kind, Name string
	// uid is the owner's UID, which a ReplicaSet or Job found by name must
	// have to be the pod's controller.
	uid string
}

// Port is a container port a pod declares.
type Port struct {
	Container, Name string
	ContainerPort   uint16
	// HostPort is 0 when the port is not exposed on the host.
	HostPort uint16
	// Protocol is "TCP", "UDP" or "SCTP".
	Protocol string
	// hostIP is the host IP the hostPort is bound to; invalid for all of
	// the pod's host IPs.
	hostIP netip.Addr
}

// Related is a related object that selects the pod and port of an answer.
type Related struct {
	Resource        schema.GroupVersionResource
	Namespace, Name string
	// Fields maps each projected field path the object has to its value
	// in JSON. Shared: do not modify.
	Fields map[string]string
}

// LabelsFor returns p's labels among keys (sorted, as Watch.LabelKeys
// returns them).
func (p *Pod) LabelsFor(keys []string) map[string]string {
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		if v, ok := p.Labels[k]; ok {
			out[k] = v
		}
	}
	return out
}

// sameAnswer reports whether a and b are the same answer, comparing the
// pods' labels among keys only, or all of them if allLabels.
func sameAnswer(a, b *Answer, keys []string, allLabels bool) bool {
	if a == b {
		return true
	}
	if a.Match != b.Match || a.Claimants != b.Claimants || !samePort(a.Port, b.Port) || !sameOwner(a.Workload, b.Workload) ||
		!slices.EqualFunc(a.Related, b.Related, sameRelated) || !slices.Equal(a.Unavailable, b.Unavailable) {
		return false
	}
	return samePod(a.Pod, b.Pod, keys, allLabels)
}

func samePod(a, b *Pod, keys []string, allLabels bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Namespace != b.Namespace || a.Name != b.Name || a.UID != b.UID || a.ServiceAccount != b.ServiceAccount ||
		a.Phase != b.Phase || a.Ready != b.Ready {
		return false
	}
	if !sameOwner(a.Owner, b.Owner) {
		return false
	}
	if allLabels {
		return maps.Equal(a.Labels, b.Labels)
	}
	for _, k := range keys {
		va, oka := a.Labels[k]
		vb, okb := b.Labels[k]
		if oka != okb || va != vb {
			return false
		}
	}
	return true
}

func sameOwner(a, b *Owner) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func samePort(a, b *Port) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func sameRelated(a, b Related) bool {
	return a.Resource == b.Resource && a.Namespace == b.Namespace && a.Name == b.Name && maps.Equal(a.Fields, b.Fields)
}

// compareRelated orders related objects of one kind.
func compareRelated(a, b Related) int {
	if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

package address

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/informerd/informerd/cache"
)

// objKey identifies an object of one resource.
type objKey struct{ namespace, name string }

func keyOf(o *cache.Object) objKey { return objKey{o.Namespace, o.Name} }

// podJSON is the part of a pod the indexes read; encoding/json skips the
// rest of the cache's bytes.
type podJSON struct {
	Metadata struct {
		UID               string                  `json:"uid"`
		CreationTimestamp string                  `json:"creationTimestamp"`
		DeletionTimestamp *string                 `json:"deletionTimestamp"`
		OwnerReferences   []metav1.OwnerReference `json:"ownerReferences"`
	} `json:"metadata"`
	Spec struct {
		HostNetwork        bool            `json:"hostNetwork"`
		ServiceAccountName string          `json:"serviceAccountName"`
		Containers         []containerJSON `json:"containers"`
		InitContainers     []containerJSON `json:"initContainers"`
	} `json:"spec"`
	Status struct {
		Phase      corev1.PodPhase `json:"phase"`
		PodIP      string          `json:"podIP"`
		PodIPs     []corev1.PodIP  `json:"podIPs"`
		HostIP     string          `json:"hostIP"`
		HostIPs    []corev1.HostIP `json:"hostIPs"`
		Conditions []conditionJSON `json:"conditions"`
	} `json:"status"`
}

type containerJSON struct {
	Name  string                 `json:"name"`
	Ports []corev1.ContainerPort `json:"ports"`
}

type conditionJSON struct {
	Type   corev1.PodConditionType `json:"type"`
	Status corev1.ConditionStatus  `json:"status"`
}

// decodePod returns what the indexes keep of a pod in the cache's JSON, or
// nil if the pod is no answer: it is terminating or finished.
func decodePod(o *cache.Object) (*Pod, error) {
	if cache.IsProtobuf(o.Data) {
		return nil, fmt.Errorf("pod %s/%s: protobuf is not read here; subscribe to pods in JSON", o.Namespace, o.Name)
	}
	var j podJSON
	if err := json.Unmarshal(o.Data, &j); err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", o.Namespace, o.Name, err)
	}
	st := &j.Status
	if j.Metadata.DeletionTimestamp != nil || st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
		return nil, nil
	}
	p := &Pod{
		Namespace: o.Namespace, Name: o.Name, UID: j.Metadata.UID, Labels: o.Labels,
		ServiceAccount: j.Spec.ServiceAccountName, Phase: string(st.Phase),
	}
	if p.Phase == "" {
		p.Phase = string(corev1.PodPending)
	}
	p.created, _ = time.Parse(time.RFC3339, j.Metadata.CreationTimestamp)
	p.Owner = controllerOf(j.Metadata.OwnerReferences)
	if st.Phase == corev1.PodRunning {
		for _, c := range st.Conditions {
			if c.Type == corev1.PodReady {
				p.Ready = c.Status == corev1.ConditionTrue
			}
		}
	}
	if !j.Spec.HostNetwork {
		p.ips = appendIP(p.ips, st.PodIP)
		for _, ip := range st.PodIPs {
			p.ips = appendIP(p.ips, ip.IP)
		}
	}
	p.hostIPs = appendIP(p.hostIPs, st.HostIP)
	for _, ip := range st.HostIPs {
		p.hostIPs = appendIP(p.hostIPs, ip.IP)
	}
	for _, cs := range [2][]containerJSON{j.Spec.Containers, j.Spec.InitContainers} {
		for _, c := range cs {
			for _, cp := range c.Ports {
				port := Port{
					Container: c.Name, Name: cp.Name, ContainerPort: uint16(cp.ContainerPort), HostPort: uint16(cp.HostPort),
					Protocol: string(cp.Protocol),
				}
				if port.Protocol == "" {
					port.Protocol = string(corev1.ProtocolTCP)
				}
				if j.Spec.HostNetwork && port.HostPort == 0 {
					port.HostPort = port.ContainerPort // on the host's network every port is a host port
				}
				if ip, err := netip.ParseAddr(cp.HostIP); err == nil && !ip.IsUnspecified() {
					port.hostIP = ip.Unmap()
				}
				p.ports = append(p.ports, port)
			}
		}
	}
	return p, nil
}

// controllerOf returns the controller among an object's owner references;
// nil if none is.
func controllerOf(refs []metav1.OwnerReference) *Owner {
	for _, r := range refs {
		if r.Controller != nil && *r.Controller {
			return &Owner{APIVersion: r.APIVersion, Kind: r.Kind, Name: r.Name, uid: string(r.UID)}
		}
	}
	return nil
}

// ownerObj is what the workload index keeps of a ReplicaSet or a Job.
type ownerObj struct {
	uid string
	// controller is the object's controller; nil when it has none.
	controller *Owner
}

// decodeOwner returns what the workload index keeps of a ReplicaSet or a
// Job in the cache's JSON.
func decodeOwner(o *cache.Object) (*ownerObj, error) {
	if cache.IsProtobuf(o.Data) {
		return nil, fmt.Errorf("%s/%s: protobuf is not read here; subscribe in JSON", o.Namespace, o.Name)
	}
	var j struct {
		Metadata struct {
			UID             string                  `json:"uid"`
			OwnerReferences []metav1.OwnerReference `json:"ownerReferences"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(o.Data, &j); err != nil {
		return nil, fmt.Errorf("%s/%s: %w", o.Namespace, o.Name, err)
	}
	return &ownerObj{uid: j.Metadata.UID, controller: controllerOf(j.Metadata.OwnerReferences)}, nil
}

// appendIP appends the IP s unless it is empty, invalid or already there.
func appendIP(ips []netip.Addr, s string) []netip.Addr {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return ips
	}
	ip = ip.Unmap()
	for _, have := range ips {
		if have == ip {
			return ips
		}
	}
	return append(ips, ip)
}

// relObj is what the indexes keep of a related object.
type relObj struct {
	namespace, name string
	// selector is nil when the object selects no pod.
	selector labels.Selector
	// port is nil when the object selects every port.
	port   *intstr.IntOrString
	fields map[string]string
}

// selects reports whether o selects pod p on a port: num is the port
// number in the pod and port, if the pod declares it, gives its name.
func (o *relObj) selects(p *Pod, num uint16, port *Port) bool {
	if o.selector == nil || o.namespace != "" && o.namespace != p.Namespace || !o.selector.Matches(labels.Set(p.Labels)) {
		return false
	}
	switch {
	case o.port == nil:
		return true
	case o.port.Type == intstr.Int:
		return o.port.IntVal == int32(num)
	default:
		return port != nil && port.Name != "" && port.Name == o.port.StrVal
	}
}

// decodeRelated returns what the indexes keep of a related object. A
// selector or port it cannot read makes it select nothing; the error says
// why, for the log.
func (k *RelatedKind) decode(o *cache.Object) (*relObj, error) {
	d := json.NewDecoder(bytes.NewReader(o.Data))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", k.Resource.Resource, o.Namespace, o.Name, err)
	}
	r := &relObj{namespace: o.Namespace, name: o.Name}
	for _, f := range k.Fields {
		if v, ok := field(m, f); ok {
			b, err := json.Marshal(v)
			if err != nil {
				return nil, fmt.Errorf("%s %s/%s: field %s: %w", k.Resource.Resource, o.Namespace, o.Name, f, err)
			}
			if r.fields == nil {
				r.fields = map[string]string{}
			}
			r.fields[f] = string(b)
		}
	}
	if k.PortPath != "" {
		switch v, _ := field(m, k.PortPath); v := v.(type) {
		case nil:
		case json.Number:
			n, err := strconv.ParseInt(string(v), 10, 32)
			if err != nil || n < 1 || n > 65535 {
				return r, fmt.Errorf("%s %s/%s: %s is %s, not a port: the object selects nothing", k.Resource.Resource, o.Namespace, o.Name, k.PortPath, v)
			}
			p := intstr.FromInt32(int32(n))
			r.port = &p
		case string:
			p := intstr.FromString(v)
			r.port = &p
		default:
			return r, fmt.Errorf("%s %s/%s: %s is not a port number or name: the object selects nothing", k.Resource.Resource, o.Namespace, o.Name, k.PortPath)
		}
	}
	v, ok := field(m, k.SelectorPath)
	sm, isMap := v.(map[string]any)
	if !ok || !isMap {
		return r, nil // no selector: selects nothing
	}
	var ls metav1.LabelSelector
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(numbersAsInts(sm), &ls); err != nil {
		return r, fmt.Errorf("%s %s/%s: %s: %w: the object selects nothing", k.Resource.Resource, o.Namespace, o.Name, k.SelectorPath, err)
	}
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		return r, fmt.Errorf("%s %s/%s: %s: %w: the object selects nothing", k.Resource.Resource, o.Namespace, o.Name, k.SelectorPath, err)
	}
	r.selector = sel
	return r, nil
}

// field returns the value at a dotted path in an object.
func field(m map[string]any, path string) (any, bool) {
	v, ok, err := unstructured.NestedFieldNoCopy(m, strings.Split(path, ".")...)
	return v, ok && err == nil
}

// numbersAsInts replaces json.Numbers, which the unstructured converter
// does not take, with int64 or float64.
func numbersAsInts(v map[string]any) map[string]any {
	var conv func(any) any
	conv = func(v any) any {
		switch v := v.(type) {
		case json.Number:
			if n, err := v.Int64(); err == nil {
				return n
			}
			f, _ := v.Float64()
			return f
		case map[string]any:
			out := make(map[string]any, len(v))
			for k, e := range v {
				out[k] = conv(e)
			}
			return out
		case []any:
			out := make([]any, len(v))
			for i, e := range v {
				out[i] = conv(e)
			}
			return out
		}
		return v
	}
	return conv(v).(map[string]any)
}

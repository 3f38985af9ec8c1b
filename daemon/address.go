package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/informerd/informerd/address"
	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/internal/quote"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// maxLabelKeys bounds WatchAddressRequest.label_keys.
const maxLabelKeys = 32

// workloadReads are what a stream that asks for workloads reads besides:
// ReplicaSets and Jobs in every namespace, as pods.
var workloadReads = []access{
	{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}},
	{GVR: schema.GroupVersionResource{Group: "batch", Version: "v1", Resource: "jobs"}},
}

// newAddresses returns the address Tracker of a Server and what its
// streams read: pods in every namespace, then each related kind.
func newAddresses(opts Options) (*address.Tracker, []access, error) {
	t, err := address.New(address.Options{
		Subscribe: address.CacheSubscriber(opts.Cache), Related: opts.AddressRelated,
		Logger: opts.Logger, Registerer: opts.Registerer,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: %w", err)
	}
	reads := []access{{GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}}}
	for _, k := range opts.AddressRelated {
		reads = append(reads, access{GVR: k.Resource})
	}
	return t, reads, nil
}

// WatchAddress implements the WatchAddress RPC: validate, authorize and
// hold what the answers read, watch the address, then send each answer
// that differs from the last one sent, until the client leaves, the
// answers fail, a re-check revokes the caller's grant, or the daemon shuts
// down. The caller must be allowed pods (and, if it asks for workloads,
// ReplicaSets and Jobs); a related kind it may not read (or hold) is
// withheld from its answers, which name it unavailable.
func (s *Server) WatchAddress(req *informerdv1.WatchAddressRequest, stream informerdv1.InformerService_WatchAddressServer) (err error) {
	areq, holder, err := validateWatchAddress(req)
	if err != nil {
		return s.reject(err)
	}
	c, err := s.begin(stream.Context(), holder)
	if err != nil {
		return err
	}
	defer func() { err = c.end(err) }()
	required := s.addressReads[:1]
	if areq.Workload {
		required = append(slices.Clip(required), workloadReads...)
	}
	for _, a := range required {
		if err := c.hold(a); err != nil && !errors.Is(err, cache.ErrUnknownResource) {
			return err
		}
	}
	for _, a := range s.addressReads[1:] {
		switch err := c.hold(a); {
		case err == nil, errors.Is(err, cache.ErrUnknownResource): // not served: no objects, see address.Tracker
		case errors.Is(err, auth.ErrDenied), errors.Is(err, errSensitive), errors.Is(err, cache.ErrLimit):
			areq.Withhold = append(areq.Withhold, address.Unavailable{Resource: a.GVR, Reason: err.Error()})
		default:
			return err
		}
	}
	w := s.addresses.Watch(areq)
	defer w.Close()
	log := c.log().With("address", areq.Address.String())
	log.Debug("address stream started")
	out := startSender(stream, s.opts.WriteTimeout)
	defer out.close()
	for {
		a, err := w.Next(c.ctx)
		if err != nil {
			return err
		}
		if err := out.send(c.ctx, answerProto(a, w.LabelKeys())); err != nil {
			if errors.Is(err, errWriteTimeout) {
				log.Info("client stopped reading: address stream ended", "timeout", s.opts.WriteTimeout)
			}
			return err
		}
	}
}

// validateWatchAddress turns a WatchAddressRequest into an address.Request
// and the client's name, or returns an INVALID_ARGUMENT status naming the
// field.
func validateWatchAddress(req *informerdv1.WatchAddressRequest) (address.Request, string, error) {
	ip, err := netip.ParseAddr(req.GetIp())
	if err != nil || ip.Zone() != "" {
		return address.Request{}, "", invalid("ip %s is not an IP address: write it as, for example, %q or %q", quote.String(req.GetIp()), "10.244.0.7", "fd00::7")
	}
	if p := req.GetPort(); p == 0 || p > 65535 {
		return address.Request{}, "", invalid("port %d is not a port: it must be 1 to 65535", p)
	}
	keys := req.GetLabelKeys()
	if len(keys) > maxLabelKeys {
		return address.Request{}, "", invalid("label_keys has %d keys, at most %d are allowed", len(keys), maxLabelKeys)
	}
	for _, k := range keys {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return address.Request{}, "", invalid("label_keys: %s is not a label key: %s", quote.String(k), errs[0])
		}
	}
	name, err := holderName(req.GetClientName())
	if err != nil {
		return address.Request{}, "", err
	}
	return address.Request{Address: netip.AddrPortFrom(ip, uint16(req.GetPort())), LabelKeys: keys, Workload: req.GetWorkload()}, name, nil
}

// answerProto converts an answer, with the pod's labels among keys.
func answerProto(a *address.Answer, keys []string) *informerdv1.WatchAddressResponse {
	resp := &informerdv1.WatchAddressResponse{Claimants: uint32(a.Claimants)}
	for _, u := range a.Unavailable {
		resp.Unavailable = append(resp.Unavailable, &informerdv1.UnavailableKind{Resource: gvrProto(u.Resource), Reason: u.Reason})
	}
	p := a.Pod
	if p == nil {
		return resp
	}
	resp.Pod = &informerdv1.AddressPod{
		Namespace: p.Namespace, Name: p.Name, Uid: p.UID, ServiceAccount: p.ServiceAccount,
		Phase: p.Phase, Ready: p.Ready,
	}
	if len(keys) > 0 {
		resp.Pod.Labels = p.LabelsFor(keys)
	}
	if o := p.Owner; o != nil {
		resp.Pod.Owner = &informerdv1.PodOwner{ApiVersion: o.APIVersion, Kind: o.Kind, Name: o.Name}
	}
	if o := a.Workload; o != nil {
		resp.Pod.Workload = &informerdv1.PodOwner{ApiVersion: o.APIVersion, Kind: o.Kind, Name: o.Name}
	}
	switch a.Match {
	case address.MatchPodIP:
		resp.Match = informerdv1.AddressMatch_ADDRESS_MATCH_POD_IP
	case address.MatchHostPort:
		resp.Match = informerdv1.AddressMatch_ADDRESS_MATCH_HOST_PORT
	}
	if pt := a.Port; pt != nil {
		resp.Port = &informerdv1.AddressPort{
			Container: pt.Container, Name: pt.Name, ContainerPort: uint32(pt.ContainerPort),
			HostPort: uint32(pt.HostPort), Protocol: pt.Protocol,
		}
	}
	for _, r := range a.Related {
		resp.Related = append(resp.Related, &informerdv1.RelatedObject{
			Resource:  gvrProto(r.Resource),
			Namespace: r.Namespace, Name: r.Name, Fields: r.Fields,
		})
	}
	return resp
}

func gvrProto(r schema.GroupVersionResource) *informerdv1.GroupVersionResource {
	return &informerdv1.GroupVersionResource{Group: r.Group, Version: r.Version, Resource: r.Resource}
}

package daemon

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// introspectPath is the non-resource URL a caller must be allowed to get
// to see every informer and stream; others see their own.
const introspectPath = "/informerd/informers"

// ListInformers implements the introspection RPC. A caller allowed get on
// introspectPath (or any caller in InsecureLocalOnly mode) sees every
// informer and every stream; another sees only the informers its own
// streams hold, and of each only what it asked for (resource, namespace,
// field selector, encoding), its state and its own streams: nothing of
// what others read or of what upstream said (a message may name objects
// of any namespace), whatever fields Informer gains.
func (s *Server) ListInformers(ctx context.Context, _ *informerdv1.ListInformersRequest) (*informerdv1.ListInformersResponse, error) {
	c := callerOf(ctx)
	all := c.user == nil
	if !all {
		_, err := s.opts.Authorizer.Authorize(ctx, c.user, auth.Attributes{Verb: "get", Path: introspectPath})
		if err != nil && !errors.Is(err, auth.ErrDenied) {
			return nil, toStatus(err)
		}
		all = err == nil
	}
	holds := s.holds.byKey(func(h *hold) bool { return all || h.caller.name == c.name })
	infos := s.opts.Cache.Sources()
	resp := &informerdv1.ListInformersResponse{Informers: make([]*informerdv1.Informer, 0, len(infos))}
	for _, in := range infos {
		mine := holds[in.Key]
		if !all && len(mine) == 0 {
			continue
		}
		// The fields every caller that holds the informer may see; the
		// rest are added for callers allowed to see everything.
		inf := &informerdv1.Informer{
			Resource: &informerdv1.GroupVersionResource{
				Group: in.Key.GVR.Group, Version: in.Key.GVR.Version, Resource: in.Key.GVR.Resource,
			},
			Namespace:     in.Key.Namespace,
			FieldSelector: in.Key.FieldSelector,
			State:         string(in.State),
			Lingering:     in.RefCount == 0,
			Encoding:      encodingOf(in.Key),
		}
		if all {
			inf.Holders, inf.RefCount, inf.Objects = in.Holders, int32(in.RefCount), int64(in.Objects)
			inf.ResourceVersion, inf.MaxLagEvents, inf.Message, inf.EventsIn = in.ResourceVersion, int64(in.MaxLagEvents), in.Message, in.EventsIn
		} else {
			inf.RefCount = int32(len(mine))
			for _, h := range mine {
				inf.Holders = append(inf.Holders, h.client)
			}
			slices.Sort(inf.Holders)
		}
		for _, h := range mine {
			inf.Subscribers = append(inf.Subscribers, &informerdv1.Subscriber{ClientName: h.client, User: h.caller.name, Peer: h.caller.peer.String()})
		}
		resp.Informers = append(resp.Informers, inf)
	}
	return resp, nil
}

// hold is one open stream on an informer, for introspection.
type hold struct {
	caller *caller
	client string
	key    func() cache.Key // the informer it holds now
}

// holdRegistry is the open streams.
type holdRegistry struct {
	mu    sync.Mutex // guards holds
	holds map[*hold]struct{}
}

// add registers h and returns the func that removes it.
func (r *holdRegistry) add(h *hold) func() {
	r.mu.Lock()
	r.holds[h] = struct{}{}
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.holds, h)
		r.mu.Unlock()
	}
}

// byKey returns the holds that keep admits, by informer, sorted by client
// and caller.
func (r *holdRegistry) byKey(keep func(*hold) bool) map[cache.Key][]*hold {
	out := map[cache.Key][]*hold{}
	r.mu.Lock()
	for h := range r.holds {
		if keep(h) {
			k := h.key()
			out[k] = append(out[k], h)
		}
	}
	r.mu.Unlock()
	for _, hs := range out {
		slices.SortFunc(hs, func(a, b *hold) int {
			return cmp.Or(strings.Compare(a.client, b.client), strings.Compare(a.caller.name, b.caller.name))
		})
	}
	return out
}

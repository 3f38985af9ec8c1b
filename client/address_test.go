package client

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// addressDaemon serves WatchAddress from scripts: each stream sends the
// next script's answers, then ends with its error.
type addressDaemon struct {
	informerdv1.UnimplementedInformerServiceServer
	mu      sync.Mutex // guards scripts and reqs
	scripts []script
	reqs    []*informerdv1.WatchAddressRequest
}

type script struct {
	answers []*informerdv1.WatchAddressResponse
	end     error
}

func (d *addressDaemon) WatchAddress(req *informerdv1.WatchAddressRequest, s informerdv1.InformerService_WatchAddressServer) error {
	d.mu.Lock()
	d.reqs = append(d.reqs, req)
	sc := d.scripts[0]
	d.scripts = d.scripts[1:]
	d.mu.Unlock()
	for _, a := range sc.answers {
		if err := s.Send(a); err != nil {
			return err
		}
	}
	return sc.end
}

func answer(name string, ready bool) *informerdv1.WatchAddressResponse {
	if name == "" {
		return &informerdv1.WatchAddressResponse{}
	}
	return &informerdv1.WatchAddressResponse{Pod: &informerdv1.AddressPod{Namespace: "ns", Name: name, Ready: ready}, Claimants: 1}
}

// TestAddressWatcherReconnects: across reconnects, the handler sees an
// answer only when it differs from the last one it saw; a terminal error
// ends Run.
func TestAddressWatcherReconnects(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "informerd is shutting down")
	d := &addressDaemon{scripts: []script{
		{[]*informerdv1.WatchAddressResponse{answer("", false), answer("a", true)}, unavailable},
		{[]*informerdv1.WatchAddressResponse{answer("a", true), answer("a", false)}, unavailable}, // the same answer first
		{nil, unavailable}, // no answer at all
		{[]*informerdv1.WatchAddressResponse{answer("a", false), answer("b", true)}, status.Error(codes.InvalidArgument, "stop here")},
	}}
	c := serveScripted(t, d)
	var seen []string
	var errs int
	opts := AddressOptions{Address: netip.MustParseAddrPort("10.0.0.1:8080"), LabelKeys: []string{"app"}, ClientName: "proxy"}
	w := NewAddressWatcher(c, opts, func(a *informerdv1.WatchAddressResponse) {
		s := "none"
		if p := a.GetPod(); p != nil {
			s = p.GetName()
			if p.GetReady() {
				s += " ready"
			}
		}
		seen = append(seen, s)
	}, AddressWatcherOptions{Backoff: Backoff{Initial: 1, Max: 1}, OnError: func(error) { errs++ }})
	err := w.Run(context.Background())
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Run = %v, want the terminal InvalidArgument", err)
	}
	want := []string{"none", "a ready", "a", "b ready"}
	if !slices.Equal(seen, want) || errs != 3 {
		t.Fatalf("handler saw %q after %d reconnects, want %q after 3", seen, errs, want)
	}
	r := d.reqs[0]
	if r.GetIp() != "10.0.0.1" || r.GetPort() != 8080 || r.GetClientName() != "proxy" || len(r.GetLabelKeys()) != 1 {
		t.Fatalf("request %v", r)
	}
}

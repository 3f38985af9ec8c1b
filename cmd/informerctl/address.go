package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// errAnswered ends a watch after its first answer.
var errAnswered = errors.New("answered")

type addressFlags struct {
	follow bool
	labels string
	o      client.AddressOptions
}

var addressCommand = newCommand("address", "IP:PORT",
	"Print who is behind an address (a pod IP, or a host IP and hostPort); -w: every change",
	func(fs *flag.FlagSet, o *addressFlags) {
		fs.BoolVar(&o.follow, "w", false, "watch: print every change until stopped")
		fs.StringVar(&o.labels, "labels", "", "comma-separated pod label keys to show")
		fs.BoolVar(&o.o.Workload, "workload", false, "show the pod's workload (Deployment, CronJob, StatefulSet...): needs list/watch on replicasets.apps and jobs.batch")
		fs.StringVar(&o.o.ClientName, "name", "informerctl", "client name shown in the daemon's logs")
	}, addressCmd)

// addressCmd prints who is behind IP:PORT; with -w, every change too.
func addressCmd(ctx context.Context, e *env, f *addressFlags, args []string) error {
	if len(args) != 1 {
		return usagef("address", "want one IP:PORT, for example 10.244.0.7:8080 or [fd00::7]:8080")
	}
	target, o, out := args[0], f.o, e.stdout
	addr, err := netip.ParseAddrPort(target)
	if err != nil {
		return usagef("address", "address %q: want IP:PORT, for example 10.244.0.7:8080 or [fd00::7]:8080", target)
	}
	o.Address = addr
	if f.labels != "" {
		o.LabelKeys = strings.Split(f.labels, ",")
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wo client.AddressWatcherOptions
	if !f.follow {
		// One answer or the first error: no reconnecting.
		wo.OnError = func(err error) { cancel(err) }
	}
	w := client.NewAddressWatcher(c, o, func(a *informerdv1.WatchAddressResponse) {
		fmt.Fprintln(out, formatAnswer(a))
		if !f.follow {
			cancel(errAnswered)
		}
	}, wo)
	if err := w.Run(ctx); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, errAnswered) && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// formatAnswer prints an answer on one line: "no pod", or the pod and
// space-separated key=value fields, related objects then unavailable
// kinds (with the reason, quoted) last.
func formatAnswer(a *informerdv1.WatchAddressResponse) string {
	p := a.GetPod()
	if p == nil {
		return strings.Join(append([]string{"no pod"}, formatUnavailable(a)...), " ")
	}
	f := []string{
		"pod " + p.GetNamespace() + "/" + p.GetName(),
		"uid=" + p.GetUid(),
		"phase=" + p.GetPhase(),
		fmt.Sprintf("ready=%v", p.GetReady()),
		"match=" + strings.ToLower(strings.TrimPrefix(a.GetMatch().String(), "ADDRESS_MATCH_")),
	}
	if pt := a.GetPort(); pt != nil {
		f = append(f, fmt.Sprintf("port=%s/%d/%s", pt.GetName(), pt.GetContainerPort(), pt.GetProtocol()))
		if pt.GetHostPort() != 0 {
			f = append(f, fmt.Sprintf("hostPort=%d", pt.GetHostPort()))
		}
	}
	if o := p.GetOwner(); o != nil {
		f = append(f, "owner="+o.GetKind()+"/"+o.GetName())
	}
	if o := p.GetWorkload(); o != nil {
		f = append(f, "workload="+o.GetKind()+"/"+o.GetName())
	}
	if sa := p.GetServiceAccount(); sa != "" {
		f = append(f, "serviceAccount="+sa)
	}
	if a.GetClaimants() > 1 {
		f = append(f, fmt.Sprintf("claimants=%d", a.GetClaimants()))
	}
	for _, k := range slices.Sorted(maps.Keys(p.GetLabels())) {
		f = append(f, "label:"+k+"="+p.GetLabels()[k])
	}
	for _, r := range a.GetRelated() {
		var kv []string
		for _, k := range slices.Sorted(maps.Keys(r.GetFields())) {
			kv = append(kv, k+"="+r.GetFields()[k])
		}
		f = append(f, "related="+groupResource(r.GetResource())+"/"+r.GetNamespace()+"/"+r.GetName()+"{"+strings.Join(kv, ",")+"}")
	}
	return strings.Join(append(f, formatUnavailable(a)...), " ")
}

// formatUnavailable prints an answer's unavailable kinds.
func formatUnavailable(a *informerdv1.WatchAddressResponse) []string {
	var f []string
	for _, u := range a.GetUnavailable() {
		f = append(f, fmt.Sprintf("unavailable=%s:%q", groupResource(u.GetResource()), u.GetReason()))
	}
	return f
}

// groupResource prints a resource as resource.group.
func groupResource(r *informerdv1.GroupVersionResource) string {
	if g := r.GetGroup(); g != "" {
		return r.GetResource() + "." + g
	}
	return r.GetResource()
}

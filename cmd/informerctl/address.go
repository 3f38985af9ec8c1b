package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// errAnswered ends a watch after its first answer.
var errAnswered = errors.New("answered")

// addressCmd prints who is behind IP:PORT; with -w, every change too.
func addressCmd(ctx context.Context, c *client.Client, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("informerctl address", flag.ContinueOnError)
	follow := fs.Bool("w", false, "watch: print every change until stopped")
	labels := fs.String("labels", "", "comma-separated pod label keys to show")
	var o client.AddressOptions
	fs.StringVar(&o.ClientName, "name", "informerctl", "client name shown in the daemon's logs")
	// Flags may come before or after IP:PORT.
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("address: missing IP:PORT, for example 10.244.0.7:8080 or [fd00::7]:8080")
	}
	target := fs.Arg(0)
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("address: unexpected arguments %q", fs.Args())
	}
	addr, err := netip.ParseAddrPort(target)
	if err != nil {
		return fmt.Errorf("address %q: want IP:PORT, for example 10.244.0.7:8080 or [fd00::7]:8080", target)
	}
	o.Address = addr
	if *labels != "" {
		o.LabelKeys = strings.Split(*labels, ",")
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wo client.AddressWatcherOptions
	if !*follow {
		// One answer or the first error: no reconnecting.
		wo.OnError = func(err error) { cancel(err) }
	}
	w := client.NewAddressWatcher(c, o, func(a *informerdv1.WatchAddressResponse) {
		fmt.Fprintln(out, formatAnswer(a))
		if !*follow {
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
// space-separated key=value fields, related objects last.
func formatAnswer(a *informerdv1.WatchAddressResponse) string {
	p := a.GetPod()
	if p == nil {
		return "no pod"
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
		res := r.GetResource().GetResource()
		if g := r.GetResource().GetGroup(); g != "" {
			res += "." + g
		}
		f = append(f, "related="+res+"/"+r.GetNamespace()+"/"+r.GetName()+"{"+strings.Join(kv, ",")+"}")
	}
	return strings.Join(f, " ")
}

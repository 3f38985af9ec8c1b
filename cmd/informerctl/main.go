// Command informerctl talks to an informerd daemon:
//
//	informerctl [-address A] [-token-file F] informers            list informers, holders and lag
//	informerctl [-address A] [-token-file F] watch -resource R    stream changes of a resource
//	informerctl [-address A] [-token-file F] address IP:PORT [-w] who is behind an address
//	informerctl [-address A] [-token-file F] status -f DIR|FILE|- show the kstatus of manifests' objects live
//
// Every call carries the token in -token-file (default
// /var/run/secrets/informerd/token), a projected ServiceAccount token with
// informerd's audience; the daemon reviews it and authorizes each watch as
// that ServiceAccount. `informers` lists the caller's own streams unless it
// may get /informerd/informers.
//
// watch prints one tab-separated line per change (ADDED, MODIFIED or
// DELETED, the object's key, its resourceVersion) and SYNCED once the
// snapshot is complete, until it is stopped.
//
// address prints the answer for an address as one line (see printAnswer)
// and, with -w, one line per change until it is stopped.
//
// status shows a table of the objects' kstatus, redrawn in place on a
// terminal (else one tab-separated line per change: status, object,
// message; SYNCED once every object's status is known). It exits 0 once
// every object is Current, and 1 naming the objects that are not when
// -timeout expires.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"

	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "informerctl:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("informerctl", flag.ContinueOnError)
	address := fs.String("address", client.DefaultSocket, "daemon address: a Unix socket path, or host:port (TLS unless loopback)")
	tokenFile := fs.String("token-file", client.DefaultTokenFile, "file with the caller's ServiceAccount token for informerd's audience, read again when it changes")
	caFile := fs.String("ca-file", "", "PEM CA bundle to verify the daemon's TLS certificate with; empty: no TLS (Unix socket or loopback only)")
	serverName := fs.String("server-name", "informerd", "name the daemon's TLS certificate is checked for, with -ca-file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("missing command: informers, watch, address or status")
	}
	var opts []grpc.DialOption
	fs.Visit(func(f *flag.Flag) { // Dial reads the default token file, if it exists, by itself
		if f.Name == "token-file" {
			opts = append(opts, client.WithTokenFile(*tokenFile))
		}
	})
	if *caFile != "" {
		opts = append(opts, client.WithTLS(*caFile, *serverName))
	}
	c, err := client.Dial(*address, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch cmd := fs.Arg(0); cmd {
	case "informers":
		return informers(ctx, c)
	case "watch":
		return watchCmd(ctx, c, fs.Args()[1:])
	case "address":
		return addressCmd(ctx, c, fs.Args()[1:], os.Stdout)
	case "status":
		return statusCmd(ctx, c, fs.Args()[1:])
	default:
		return fmt.Errorf("unknown command %q: want informers, watch, address or status", cmd)
	}
}

func informers(ctx context.Context, c *client.Client) error {
	resp, err := c.API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tNAMESPACE\tSTATE\tREFS\tOBJECTS\tRV\tLAG\tHOLDERS\tCALLERS\tMESSAGE")
	for _, in := range resp.GetInformers() {
		r := in.GetResource()
		res := r.GetResource() + "." + r.GetVersion()
		if r.GetGroup() != "" {
			res += "." + r.GetGroup()
		}
		state := in.GetState()
		if in.GetLingering() {
			state += ",lingering"
		}
		ns := in.GetNamespace()
		if ns == "" {
			ns = "*"
		}
		if in.GetEncoding() == informerdv1.Encoding_ENCODING_PROTOBUF {
			res += " (protobuf)"
		}
		var callers []string // user (peer), once each
		for _, sub := range in.GetSubscribers() {
			if c := sub.GetUser() + " (" + sub.GetPeer() + ")"; !slices.Contains(callers, c) {
				callers = append(callers, c)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%d\t%s\t%s\t%s\n", res, ns, state, in.GetRefCount(), in.GetObjects(),
			in.GetResourceVersion(), in.GetMaxLagEvents(), strings.Join(in.GetHolders(), ","), strings.Join(callers, ","), in.GetMessage())
	}
	return tw.Flush()
}

func watchCmd(ctx context.Context, c *client.Client, args []string) error {
	fs := flag.NewFlagSet("informerctl watch", flag.ContinueOnError)
	resource := fs.String("resource", "", "resource as resource[.version[.group]], e.g. configmaps, deployments.v1.apps")
	var o client.WatchOptions
	fs.StringVar(&o.Namespace, "namespace", "", "namespace; empty: all")
	fs.StringVar(&o.LabelSelector, "selector", "", "label selector")
	fs.StringVar(&o.FieldSelector, "field-selector", "", "field selector")
	fs.StringVar(&o.ClientName, "name", "informerctl", "client name shown in `informerctl informers`")
	fs.BoolVar(&o.MetadataOnly, "metadata-only", false, "receive metadata only")
	if err := fs.Parse(args); err != nil {
		return err
	}
	gvr, err := parseResource(*resource)
	if err != nil {
		return fmt.Errorf("-resource %q: %w", *resource, err)
	}
	o.Resource = gvr
	return client.NewWatcher(c, o, printer{}, client.WatcherOptions{}).Run(ctx)
}

// parseResource reads resource[.version[.group]]; the version defaults to
// v1 and the group to the core group.
func parseResource(s string) (schema.GroupVersionResource, error) {
	if s == "" {
		return schema.GroupVersionResource{}, errors.New("required")
	}
	parts := strings.SplitN(s, ".", 3)
	gvr := schema.GroupVersionResource{Resource: parts[0], Version: "v1"}
	if len(parts) > 1 {
		gvr.Version = parts[1]
	}
	if len(parts) > 2 {
		gvr.Group = parts[2]
	}
	return gvr, nil
}

// printer prints each change the Watcher hands it.
type printer struct{}

func (printer) print(verb string, obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	o := obj.(*unstructured.Unstructured)
	key := o.GetName()
	if ns := o.GetNamespace(); ns != "" {
		key = ns + "/" + key
	}
	fmt.Printf("%s\t%s\t%s\n", verb, key, o.GetResourceVersion())
}

func (p printer) OnAdd(o any, _ bool) { p.print("ADDED", o) }
func (p printer) OnUpdate(_, o any)   { p.print("MODIFIED", o) }
func (p printer) OnDelete(o any)      { p.print("DELETED", o) }
func (printer) OnSynced()             { fmt.Println("SYNCED") }

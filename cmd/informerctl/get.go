package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// objectFlags are get's and watch's flags.
type objectFlags struct {
	namespace     string
	all           bool
	selector      string
	fieldSelector string
	output        string
	clientName    string
	metadataOnly  bool
	resource      string // watch -resource, the former spelling of RESOURCE
}

// serviceAccountNamespace is where a pod finds its namespace, which
// kubectl, too, takes as the default in a pod.
const serviceAccountNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// defaultNamespace is the pod's namespace in a pod, else "default".
func defaultNamespace() string {
	if b, err := os.ReadFile(serviceAccountNamespace); err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b))
	}
	return "default"
}

func (o *objectFlags) register(fs *flag.FlagSet) {
	ns := defaultNamespace()
	for _, n := range []string{"n", "namespace"} {
		fs.StringVar(&o.namespace, n, ns, "namespace (ignored for cluster-scoped resources)")
	}
	for _, n := range []string{"A", "all-namespaces"} {
		fs.BoolVar(&o.all, n, false, "all namespaces")
	}
	for _, n := range []string{"l", "selector"} {
		fs.StringVar(&o.selector, n, "", "label selector, for example app=web,tier!=db")
	}
	fs.StringVar(&o.fieldSelector, "field-selector", "", "field selector, as the API server supports it for the resource (an informer of its own)")
	for _, n := range []string{"o", "output"} {
		fs.StringVar(&o.output, n, "", "output format: wide, json, yaml or name; empty: a table")
	}
	fs.StringVar(&o.clientName, "client-name", "informerctl", "client name shown by informerctl informers and in the daemon's logs")
	fs.BoolVar(&o.metadataOnly, "metadata-only", false, "receive apiVersion, kind and metadata only (tables and names always do)")
}

// options returns the watch options for gvr.
func (o *objectFlags) options(gvr schema.GroupVersionResource) client.WatchOptions {
	wo := client.WatchOptions{
		Resource: gvr, Namespace: o.namespace, LabelSelector: o.selector, FieldSelector: o.fieldSelector, ClientName: o.clientName,
		MetadataOnly: o.metadataOnly || o.output == outputTable || o.output == outputWide || o.output == outputName,
	}
	if o.all {
		wo.Namespace = ""
	}
	return wo
}

var getCommand = newCommand("get", "RESOURCE [NAME...]",
	"Print objects from the daemon's informers (RESOURCE[.VERSION][.GROUP], e.g. configmaps, deployments.apps)",
	func(fs *flag.FlagSet, o *objectFlags) { o.register(fs) }, getCmd)

func getCmd(ctx context.Context, e *env, o *objectFlags, args []string) error {
	if len(args) == 0 {
		return usagef("get", "missing RESOURCE, for example configmaps or deployments.apps")
	}
	gvr, err := parseResource(args[0])
	if err != nil {
		return usageError{err: err, cmd: "get"}
	}
	names := args[1:]
	switch {
	case len(names) > 0 && o.all:
		return usagef("get", "a NAME cannot be retrieved across all namespaces (-A): name its namespace with -n")
	case len(names) > 0 && o.selector != "":
		return usagef("get", "give NAMEs or a selector (-l), not both")
	}
	if err := checkOutput("get", o.output); err != nil {
		return err
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	wo := scoped(ctx, c, o.options(gvr))
	var objs []*unstructured.Unstructured
	var errs []error
	if len(names) == 0 {
		if objs, err = list(ctx, c, wo); err != nil {
			return err
		}
	}
	for _, name := range names {
		obj, err := get(ctx, c, wo, name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		objs = append(objs, obj)
	}
	if err := printObjects(e, o, objs, len(names) == 1 && len(objs) == 1, time.Now()); err != nil {
		return err
	}
	if len(names) == 0 && len(objs) == 0 && (o.output == outputTable || o.output == outputWide) {
		if wo.Namespace == "" {
			fmt.Fprintln(e.stderr, "No resources found.")
		} else {
			fmt.Fprintf(e.stderr, "No resources found in %s namespace.\n", wo.Namespace)
		}
	}
	for _, err := range errs[:max(len(errs)-1, 0)] { // the last one is run's to print
		fmt.Fprintln(e.stderr, describeError(err, e.conn.address))
	}
	if len(errs) > 0 {
		return errs[len(errs)-1]
	}
	return nil
}

// list returns the objects of a snapshot: a stream's events up to SYNCED,
// sorted by namespace and name.
func list(ctx context.Context, c *client.Client, wo client.WatchOptions) ([]*unstructured.Unstructured, error) {
	s, err := c.Stream(ctx, wo, "")
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var objs []*unstructured.Unstructured
	for {
		evs, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the daemon ended the stream before the snapshot was complete: try again")
		}
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			switch ev.GetType() {
			case informerdv1.EventType_EVENT_TYPE_ADDED:
				u := &unstructured.Unstructured{}
				if err := u.UnmarshalJSON(ev.GetObject()); err != nil {
					return nil, fmt.Errorf("decoding an object the daemon sent: %w", err)
				}
				objs = append(objs, u)
			case informerdv1.EventType_EVENT_TYPE_SYNCED:
				slices.SortFunc(objs, func(a, b *unstructured.Unstructured) int {
					return strings.Compare(a.GetNamespace()+"/"+a.GetName(), b.GetNamespace()+"/"+b.GetName())
				})
				return objs, nil
			}
		}
	}
}

// scoped drops wo's namespace if its resource is cluster-scoped, as
// kubectl ignores -n for one: the daemon, like the API server, refuses a
// namespace of a cluster-scoped resource. It asks with a Get of a name no
// object has.
// Any other answer is the list's or watch's to give.
func scoped(ctx context.Context, c *client.Client, wo client.WatchOptions) client.WatchOptions {
	if wo.Namespace == "" {
		return wo
	}
	_, err := get(ctx, c, wo, "informerctl-scope-probe")
	if st, ok := status.FromError(err); ok && hasReason(st, informerdv1.ReasonClusterScoped) {
		wo.Namespace = ""
	}
	return wo
}

// get returns one object, from the daemon's Get.
func get(ctx context.Context, c *client.Client, wo client.WatchOptions, name string) (*unstructured.Unstructured, error) {
	view := informerdv1.View_VIEW_FULL
	if wo.MetadataOnly {
		view = informerdv1.View_VIEW_METADATA
	}
	resp, err := c.API().Get(ctx, &informerdv1.GetRequest{
		Resource:  &informerdv1.GroupVersionResource{Group: wo.Resource.Group, Version: wo.Resource.Version, Resource: wo.Resource.Resource},
		Namespace: wo.Namespace, Name: name, View: view, ClientName: wo.ClientName,
	})
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(resp.GetObject()); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", name, err)
	}
	return u, nil
}

// printObjects prints objs in o's output format; single prints the one
// object itself in json and yaml, else a List.
func printObjects(e *env, o *objectFlags, objs []*unstructured.Unstructured, single bool, now time.Time) error {
	switch o.output {
	case outputJSON, outputYAML:
		var v any
		if single {
			v = objs[0].Object
		} else {
			items := make([]any, len(objs))
			for i, u := range objs {
				items[i] = u.Object
			}
			v = map[string]any{"apiVersion": "v1", "kind": "List", "metadata": map[string]any{"resourceVersion": ""}, "items": items}
		}
		b, err := marshal(v, o.output)
		if err != nil {
			return err
		}
		_, err = e.stdout.Write(b)
		return writeError(err)
	case outputName:
		var b strings.Builder
		for _, u := range objs {
			b.WriteString(objectName(u) + "\n")
		}
		_, err := io.WriteString(e.stdout, b.String())
		return writeError(err)
	}
	if len(objs) == 0 {
		return nil
	}
	withNS := o.all && slices.ContainsFunc(objs, func(u *unstructured.Unstructured) bool { return u.GetNamespace() != "" })
	rows := [][]string{objectColumns(withNS, o.output == outputWide)}
	for _, u := range objs {
		rows = append(rows, objectRow(u, withNS, o.output == outputWide, now))
	}
	return writeError((&table{}).print(e.stdout, rows...))
}

var watchCommand = newCommand("watch", "RESOURCE", "Print the objects of a resource, SYNCED, then every change until stopped",
	func(fs *flag.FlagSet, o *objectFlags) {
		o.register(fs)
		fs.StringVar(&o.resource, "resource", "", "the RESOURCE argument, as a flag (an earlier spelling)")
		fs.StringVar(&o.clientName, "name", "informerctl", "the same as -client-name (an earlier spelling)")
	}, watchCmd)

func watchCmd(ctx context.Context, e *env, o *objectFlags, args []string) error {
	if o.resource != "" {
		args = append([]string{o.resource}, args...)
	}
	switch {
	case len(args) == 0:
		return usagef("watch", "missing RESOURCE, for example configmaps or deployments.apps")
	case len(args) > 1:
		return usagef("watch", "unexpected arguments %q after RESOURCE: watch takes one resource (and -l to select objects)", args[1:])
	}
	gvr, err := parseResource(args[0])
	if err != nil {
		return usageError{err: err, cmd: "watch"}
	}
	if err := checkOutput("watch", o.output); err != nil {
		return err
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	wo := scoped(ctx, c, o.options(gvr))
	p := newWatchPrinter(e.stdout, o.output, o.all, time.Now)
	w := client.NewWatcher(c, wo, p, client.WatcherOptions{OnError: func(err error) {
		if !p.synced { // nothing shown yet: say why and stop
			cancel(err)
			return
		}
		fmt.Fprintf(e.stderr, "warning: %s\nreconnecting...\n", describeError(err, e.conn.address))
	}})
	if err := w.Run(ctx); err != nil {
		return err
	}
	if p.err != nil {
		return p.err
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// watchPrinter prints a Watcher's changes, each with its event: ADDED,
// MODIFIED or DELETED, and SYNCED once the snapshot is complete. A table
// prints the snapshot's rows together at SYNCED, so that they line up.
type watchPrinter struct {
	out    io.Writer
	format string
	all    bool
	now    func() time.Time

	synced   bool
	snapshot []*unstructured.Unstructured
	table    table
	withNS   bool
	err      error // the first write error; nothing more is printed
}

var _ toolscache.ResourceEventHandler = (*watchPrinter)(nil)

func newWatchPrinter(out io.Writer, format string, all bool, now func() time.Time) *watchPrinter {
	// The EVENT column is as wide as its widest value from the start.
	return &watchPrinter{out: out, format: format, all: all, now: now, table: table{widths: []int{len("MODIFIED")}}}
}

func (p *watchPrinter) OnAdd(o any, _ bool) { p.event("ADDED", o) }
func (p *watchPrinter) OnUpdate(_, o any)   { p.event("MODIFIED", o) }
func (p *watchPrinter) OnDelete(o any)      { p.event("DELETED", o) }

func (p *watchPrinter) event(verb string, obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u := obj.(*unstructured.Unstructured)
	if !p.synced && (p.format == outputTable || p.format == outputWide) {
		p.snapshot = append(p.snapshot, u)
		return
	}
	p.write(p.line(verb, u))
}

func (p *watchPrinter) OnSynced() {
	p.synced = true
	wide := p.format == outputWide
	switch p.format {
	case outputTable, outputWide:
		p.withNS = p.all && (len(p.snapshot) == 0 || slices.ContainsFunc(p.snapshot, func(u *unstructured.Unstructured) bool { return u.GetNamespace() != "" }))
		rows := [][]string{append([]string{"EVENT"}, objectColumns(p.withNS, wide)...)}
		for _, u := range p.snapshot {
			rows = append(rows, append([]string{"ADDED"}, objectRow(u, p.withNS, wide, p.now())...))
		}
		rows = append(rows, []string{"SYNCED"})
		p.snapshot = nil
		var b strings.Builder
		_ = p.table.print(&b, rows...) // a Builder does not fail
		p.write(b.String())
	default:
		p.write(p.line("SYNCED", nil))
	}
}

// line formats one event (u is nil for SYNCED).
func (p *watchPrinter) line(verb string, u *unstructured.Unstructured) string {
	switch p.format {
	case outputJSON, outputYAML:
		v := map[string]any{"type": verb}
		if u != nil {
			v["object"] = u.Object
		}
		if p.format == outputYAML {
			b, _ := marshal(v, outputYAML) // maps of JSON values: cannot fail
			return "---\n" + string(b)
		}
		b, _ := json.Marshal(v)
		return string(b) + "\n"
	case outputName:
		if u == nil {
			return verb + "\n"
		}
		return verb + " " + objectName(u) + "\n"
	}
	var b strings.Builder
	_ = p.table.print(&b, append([]string{verb}, objectRow(u, p.withNS, p.format == outputWide, p.now())...))
	return b.String()
}

func (p *watchPrinter) write(s string) {
	if p.err != nil {
		return
	}
	_, err := io.WriteString(p.out, s)
	p.err = writeError(err)
}

// versionPattern is an API version (v1, v2beta1), which tells
// RESOURCE.VERSION.GROUP from RESOURCE.GROUP.
var versionPattern = regexp.MustCompile(`^v[0-9]+((alpha|beta)[0-9]+)?$`)

// parseResource reads RESOURCE[.VERSION][.GROUP] as kubectl does:
// configmaps, deployments.apps, deployments.v1.apps, and a short name
// (cm) or kind (Deployment) in place of RESOURCE, which the daemon
// resolves. Without a version the daemon takes the API server's
// preferred one.
func parseResource(s string) (schema.GroupVersionResource, error) {
	if s == "" {
		return schema.GroupVersionResource{}, errors.New("empty RESOURCE: name one, for example configmaps or deployments.apps")
	}
	res, rest, _ := strings.Cut(s, ".")
	gvr := schema.GroupVersionResource{Resource: res}
	if v, group, _ := strings.Cut(rest, "."); versionPattern.MatchString(v) {
		gvr.Version, gvr.Group = v, group
	} else {
		gvr.Group = rest
	}
	if res == "" {
		return gvr, fmt.Errorf("RESOURCE %q: want a resource name, for example configmaps, cm or deployments.apps", s)
	}
	gvr.Resource = strings.ToLower(res) // a kind (Deployment) is its singular name, as kubectl takes it
	return gvr, nil
}

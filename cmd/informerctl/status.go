package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/cli-utils/pkg/kstatus/polling/event"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/cli-utils/pkg/kstatus/watcher"
	"sigs.k8s.io/cli-utils/pkg/object"

	"github.com/informerd/informerd/client/statuswatcher"
)

type statusFlags struct {
	files, namespace, scope, name string
	timeout                       time.Duration
}

var statusCommand = newCommand("status", "-f DIR|FILE|-", "Show the kstatus of manifests' objects live; exit 0 once all are Current",
	func(fs *flag.FlagSet, o *statusFlags) {
		fs.StringVar(&o.files, "f", "", "manifests: a file, a directory of .yaml, .yml and .json files, or - for standard input")
		fs.StringVar(&o.namespace, "namespace", "default", "namespace of the namespaced objects that name none")
		fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long, naming the objects that are not Current (0: wait until all are)")
		fs.StringVar(&o.scope, "scope", "automatic", "REST scope strategy: automatic, root or namespace")
		fs.StringVar(&o.name, "name", "informerctl", "client name shown by informerctl informers")
	}, statusCmd)

// statusCmd shows the kstatus of the objects of a set of manifests live,
// and succeeds once all are Current.
func statusCmd(ctx context.Context, e *env, o *statusFlags, args []string) error {
	if len(args) > 0 {
		return usagef("status", "unexpected arguments %q: give the manifests with -f", args)
	}
	if o.files == "" {
		return usagef("status", "-f is required: a manifest file, a directory, or - for standard input")
	}
	strategy, ok := map[string]watcher.RESTScopeStrategy{
		"automatic": watcher.RESTScopeAutomatic, "root": watcher.RESTScopeRoot, "namespace": watcher.RESTScopeNamespace,
	}[o.scope]
	if !ok {
		return usagef("status", "-scope %q: want automatic, root or namespace", o.scope)
	}
	ids, err := readManifests(o.files, os.Stdin, o.namespace)
	if err != nil {
		return err
	}
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	v := newStatusView(e.stdout, e.terminal, ids)
	v.width = e.width
	sw := statuswatcher.New(c, statuswatcher.Options{ClientName: o.name, IdentityOnly: true})
	return v.run(ctx, sw.Watch(ctx, ids, watcher.Options{RESTScopeStrategy: strategy}))
}

// statusView shows the latest status of each object: a table redrawn in
// place on a terminal, else one line per change.
type statusView struct {
	out      io.Writer
	terminal bool
	ids      object.ObjMetadataSet // in the manifests' order
	latest   map[object.ObjMetadata]*event.ResourceStatus
	synced   bool
	width    func() int // the terminal's width; nil: unknown
	lines    int        // the table's height on the terminal, to redraw it
	drawn    time.Time  // when the table was last drawn
}

func newStatusView(out io.Writer, terminal bool, ids object.ObjMetadataSet) *statusView {
	return &statusView{out: out, terminal: terminal, ids: ids, latest: map[object.ObjMetadata]*event.ResourceStatus{}}
}

// redrawEvery bounds how often the table is redrawn while events stream.
const redrawEvery = 100 * time.Millisecond

// run shows events until every object is Current (nil), the watcher fails,
// or ctx ends (an error naming the objects that are not Current).
func (v *statusView) run(ctx context.Context, events <-chan event.Event) error {
	for ev := range events {
		switch ev.Type {
		case event.ErrorEvent:
			v.draw(true)
			return ev.Error
		case event.SyncEvent:
			v.synced = true
			if !v.terminal {
				fmt.Fprintln(v.out, "SYNCED")
			}
		case event.ResourceUpdateEvent:
			v.latest[ev.Resource.Identifier] = ev.Resource
			if !v.terminal {
				fmt.Fprintf(v.out, "%s\t%s\t%s\n", ev.Resource.Status, describe(ev.Resource.Identifier), ev.Resource.Message)
			}
		}
		done := v.synced && len(v.notCurrent()) == 0
		v.draw(done)
		if done {
			return nil
		}
	}
	v.draw(true)
	why := "stopped"
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		why = "timed out"
	}
	return fmt.Errorf("%s with %d of %d objects not Current: %s", why, len(v.notCurrent()), len(v.ids), strings.Join(v.notCurrent(), ", "))
}

// draw redraws the table on a terminal, at most every redrawEvery unless
// final.
func (v *statusView) draw(final bool) {
	if !v.terminal || (!final && time.Since(v.drawn) < redrawEvery) {
		return
	}
	v.drawn = time.Now()
	if v.lines > 0 {
		fmt.Fprintf(v.out, "\x1b[%dF\x1b[J", v.lines) // back to the table's first line, and clear below
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tKIND\tNAMESPACE\tNAME\tMESSAGE")
	for _, id := range v.ids {
		st, msg := "Unknown", "waiting for the daemon"
		if rs := v.latest[id]; rs != nil {
			st, msg = string(rs.Status), rs.Message
		}
		kind := id.GroupKind.Kind
		if id.GroupKind.Group != "" {
			kind += "." + id.GroupKind.Group
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", st, kind, id.Namespace, id.Name, msg)
	}
	_ = tw.Flush()
	text := b.String()
	if v.width != nil { // one row per line, or the redraw would miss the wrapped ones
		text = truncateLines(text, v.width())
	}
	v.lines = strings.Count(text, "\n")
	_, _ = io.WriteString(v.out, text) // a terminal that went away: nothing to do
}

// notCurrent describes the objects whose latest status is not Current.
func (v *statusView) notCurrent() []string {
	var out []string
	for _, id := range v.ids {
		rs := v.latest[id]
		switch {
		case rs == nil:
			out = append(out, describe(id)+" (no status yet)")
		case rs.Status != kstatus.CurrentStatus:
			out = append(out, fmt.Sprintf("%s (%s: %s)", describe(id), rs.Status, rs.Message))
		}
	}
	return out
}

func describe(id object.ObjMetadata) string {
	s := id.GroupKind.Kind
	if id.GroupKind.Group != "" {
		s += "." + id.GroupKind.Group
	}
	if id.Namespace != "" {
		return s + " " + id.Namespace + "/" + id.Name
	}
	return s + " " + id.Name
}

// readManifests returns the objects of the manifests at path ("-": stdin),
// in order, without duplicates. A namespaced object that names no
// namespace is in defaultNS; whether a kind is namespaced comes from
// clusterScoped and from the CRDs among the manifests.
func readManifests(path string, stdin io.Reader, defaultNS string) (object.ObjMetadataSet, error) {
	var objs []*unstructured.Unstructured
	read := func(name string, r io.Reader) error {
		d := yaml.NewYAMLOrJSONDecoder(r, 4096)
		for i := 0; ; i++ {
			var m map[string]any
			if err := d.Decode(&m); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return fmt.Errorf("%s, document %d: %w", name, i+1, err)
			}
			if m == nil {
				continue // an empty document
			}
			u := &unstructured.Unstructured{Object: m}
			if u.IsList() {
				l, err := u.ToList()
				if err != nil {
					return fmt.Errorf("%s, document %d: %w", name, i+1, err)
				}
				for j := range l.Items {
					objs = append(objs, &l.Items[j])
				}
				continue
			}
			if u.GetKind() == "" || u.GetName() == "" {
				return fmt.Errorf("%s, document %d: an object needs a kind and a metadata.name", name, i+1)
			}
			objs = append(objs, u)
		}
	}
	if err := readPaths(path, stdin, read); err != nil {
		return nil, err
	}
	crdScoped := map[schema.GroupKind]bool{}
	for _, o := range objs {
		if gk, ok := object.GetCRDGroupKind(o); ok {
			scope, _, _ := unstructured.NestedString(o.Object, "spec", "scope")
			crdScoped[gk] = scope == "Cluster"
		}
	}
	var ids object.ObjMetadataSet
	for _, o := range objs {
		id := object.UnstructuredToObjMetadata(o)
		if id.Namespace == "" && !clusterScoped[id.GroupKind] && !crdScoped[id.GroupKind] {
			id.Namespace = defaultNS
		}
		if !ids.Contains(id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// readPaths calls read for stdin ("-"), a file, or each manifest file of
// a directory, in name order.
func readPaths(path string, stdin io.Reader, read func(name string, r io.Reader) error) error {
	if path == "-" {
		return read("standard input", stdin)
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	files := []string{path}
	if st.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		files = files[:0]
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && slices.Contains([]string{".yaml", ".yml", ".json"}, ext) {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		if len(files) == 0 {
			return fmt.Errorf("%s holds no .yaml, .yml or .json file", path)
		}
	}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		err = read(name, f)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// clusterScoped are the built-in kinds that are not namespaced; the scope
// of custom kinds comes from their CRDs among the manifests.
var clusterScoped = map[schema.GroupKind]bool{}

func init() {
	for group, kinds := range map[string][]string{
		"":                             {"Namespace", "Node", "PersistentVolume", "ComponentStatus"},
		"admissionregistration.k8s.io": {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"},
		"apiextensions.k8s.io":         {"CustomResourceDefinition"},
		"apiregistration.k8s.io":       {"APIService"},
		"certificates.k8s.io":          {"CertificateSigningRequest", "ClusterTrustBundle"},
		"flowcontrol.apiserver.k8s.io": {"FlowSchema", "PriorityLevelConfiguration"},
		"networking.k8s.io":            {"IngressClass", "IPAddress", "ServiceCIDR"},
		"node.k8s.io":                  {"RuntimeClass"},
		"rbac.authorization.k8s.io":    {"ClusterRole", "ClusterRoleBinding"},
		"resource.k8s.io":              {"DeviceClass", "ResourceSlice"},
		"scheduling.k8s.io":            {"PriorityClass"},
		"storage.k8s.io":               {"CSIDriver", "CSINode", "StorageClass", "VolumeAttachment", "VolumeAttributesClass"},
		"storagemigration.k8s.io":      {"StorageVersionMigration"},
	} {
		for _, k := range kinds {
			clusterScoped[schema.GroupKind{Group: group, Kind: k}] = true
		}
	}
}

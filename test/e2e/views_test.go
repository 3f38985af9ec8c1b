package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/client"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// TestViewsAndKind: a resource named by kind resolves to its resource; the
// full view carries the object whole, managedFields included; the metadata
// view carries metadata only.
func TestViewsAndKind(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := createNamespace(ctx, t, "views")
	createConfigMap(ctx, t, ns, "payload", map[string]string{"secret-sauce": "ketchup"})
	d := startDaemon(t, cache.Options{})
	c := d.dial(t, reads(configMaps, ns))

	first := func(opts client.WatchOptions) string {
		t.Helper()
		s, err := c.Stream(ctx, opts, "")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for {
			evs, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				if ev.GetType() == informerdv1.EventType_EVENT_TYPE_ADDED && strings.Contains(string(ev.GetObject()), `"payload"`) {
					return string(ev.GetObject())
				}
			}
		}
	}
	full := first(client.WatchOptions{Kind: "ConfigMap", Namespace: ns, ClientName: "by-kind"})
	if !strings.Contains(full, "ketchup") || !strings.Contains(full, `"managedFields"`) {
		t.Fatalf("full view = %s; want the data and managedFields", full)
	}
	meta := first(client.WatchOptions{Resource: configMaps, Namespace: ns, MetadataOnly: true, ClientName: "meta"})
	if strings.Contains(meta, "ketchup") || !strings.Contains(meta, `"kind":"ConfigMap"`) || !strings.Contains(meta, `"resourceVersion"`) {
		t.Fatalf("metadata view = %s; want kind and metadata only", meta)
	}
}

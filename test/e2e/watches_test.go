package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// watchLog follows the API server's audit log for the watches open now:
// the log has the ResponseStarted and ResponseComplete events of every
// watch (TestMain's audit policy), written before the watch proceeds.
// It reads only what was appended since its last read.
type watchLog struct {
	mu     sync.Mutex
	offset int64
	// open are the watches open now, by audit ID.
	open map[string]openWatch
}

type openWatch struct {
	gr        schema.GroupResource
	userAgent string
}

var watches = &watchLog{open: map[string]openWatch{}}

// controllerManager is the user agent of every kube-controller-manager
// client: its controllers (as their ServiceAccounts) and its shared and
// metadata informers (as its own kubeconfig's user, which here is the
// tests' admin). Its garbage collector watches every resource, CRs
// included, from up to 30 s after their CRD appears: counting it would
// make every count of a new resource move under a test.
const controllerManager = "kube-controller-manager/"

// upstreamWatches is how many watches of gvr (any version) the API server
// holds now, except kube-controller-manager's (by its user agent).
func upstreamWatches(t *testing.T, gvr schema.GroupVersionResource) int {
	t.Helper()
	watches.mu.Lock()
	defer watches.mu.Unlock()
	watches.read(t)
	n := 0
	for _, w := range watches.open {
		if w.gr == gvr.GroupResource() && !strings.HasPrefix(w.userAgent, controllerManager) {
			n++
		}
	}
	return n
}

// read applies the audit events appended since the last read.
func (l *watchLog) read(t *testing.T) {
	t.Helper()
	f, err := os.Open(deployAudit.path)
	if err != nil {
		t.Fatalf("the API server's audit log: %v", err)
	}
	defer f.Close()
	if _, err := f.Seek(l.offset, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil { // io.EOF, or a line the API server is still writing
			break
		}
		l.offset += int64(len(line))
		var ev struct {
			AuditID   string `json:"auditID"`
			Stage     string `json:"stage"`
			Verb      string `json:"verb"`
			UserAgent string `json:"userAgent"`
			ObjectRef *struct {
				APIGroup string `json:"apiGroup"`
				Resource string `json:"resource"`
			} `json:"objectRef"`
		}
		if err := json.Unmarshal(line, &ev); err != nil {
			t.Fatalf("audit log line %q: %v", line, err)
		}
		if ev.Verb != "watch" || ev.ObjectRef == nil {
			continue
		}
		switch ev.Stage {
		case "ResponseStarted":
			l.open[ev.AuditID] = openWatch{gr: schema.GroupResource{Group: ev.ObjectRef.APIGroup, Resource: ev.ObjectRef.Resource}, userAgent: ev.UserAgent}
		case "ResponseComplete", "Panic":
			delete(l.open, ev.AuditID)
		}
	}
}

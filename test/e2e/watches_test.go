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
	gr   schema.GroupResource
	user string
}

var watches = &watchLog{open: map[string]openWatch{}}

// controllerUsers are kube-controller-manager's controllers, each with
// its own ServiceAccount (--use-service-account-credentials). Its garbage
// collector watches every resource, CRs included, from up to 30 s after
// its CRD appears: counting it would make every count of a new resource
// move under a test.
const controllerUsers = "system:serviceaccount:kube-system:"

// upstreamWatches is how many watches of gvr (any version) the API server
// holds now, except kube-controller-manager's.
func upstreamWatches(t *testing.T, gvr schema.GroupVersionResource) int {
	t.Helper()
	watches.mu.Lock()
	defer watches.mu.Unlock()
	watches.read(t)
	n := 0
	for _, w := range watches.open {
		if w.gr == gvr.GroupResource() && !strings.HasPrefix(w.user, controllerUsers) {
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
			AuditID string `json:"auditID"`
			Stage   string `json:"stage"`
			Verb    string `json:"verb"`
			User    struct {
				Username string `json:"username"`
			} `json:"user"`
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
			l.open[ev.AuditID] = openWatch{gr: schema.GroupResource{Group: ev.ObjectRef.APIGroup, Resource: ev.ObjectRef.Resource}, user: ev.User.Username}
		case "ResponseComplete", "Panic":
			delete(l.open, ev.AuditID)
		}
	}
}

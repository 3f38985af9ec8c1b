package wrapconfig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/internal/fieldsel"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

// Options configure Wrap. Zero values take the defaults.
type Options struct {
	// ClientName identifies the process in the daemon's introspection.
	// Default: the config's UserAgent, else "wrapconfig".
	ClientName string
	// Strict answers what the daemon does not serve with an error instead
	// of passing it to the API server: requests it cannot serve fail with
	// an error naming the reason, and the daemon's refusals come back as
	// the API server's Status (404, 403, 400, 429, 401, and 503 while the
	// daemon is unreachable). Default false: they pass through, counted.
	Strict bool
	// DialTimeout bounds how long a request waits for the connection to
	// the daemon before it goes to the API server instead. Default 1s;
	// while the connection is failing, requests go there at once.
	DialTimeout time.Duration
	// Registerer, if set, registers informerd_client_wrap_requests_total.
	// Configs wrapped with one Registerer share the counter.
	Registerer prometheus.Registerer
}

// The outcomes of informerd_client_wrap_requests_total.
const (
	outcomeServed   = "served"    // answered by the daemon
	outcomePassed   = "passed"    // passed through to the API server, by design or because the daemon would not answer exactly
	outcomeFellBack = "fell_back" // passed through because the daemon was unreachable or unavailable
	outcomeRefused  = "refused"   // Strict: failed instead of passing through
)

// Wrap returns a copy of cfg whose transport answers list and watch
// GETs of any resource from c's daemon, in the wire format the caller
// asked for (JSON, protobuf as the API server encoded it, or
// PartialObjectMetadata), and passes every other request to the API
// server with cfg's credentials, unchanged: writes, GETs of one object,
// subresources, discovery, Table and YAML requests, and what the daemon
// cannot answer exactly (a Exact resourceVersion, a continue token it did not issue,
// parameters it does not know, a resource it does not serve or refuses).
// Requests it serves carry none of cfg's credentials: the daemon
// authorizes them as c's token. When the daemon is unreachable, requests
// fall back to the API server after DialTimeout, and come back once it is
// reachable; a watch it was serving ends as a watch the API server ends,
// and the caller's reflector resumes where it was. docs/adoption.md says
// what is served and how.
//
// One wrapped config, and every client made from it, may be used
// concurrently; c must stay open while they are in use.
func Wrap(cfg *rest.Config, c *client.Client, o Options) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	if o.ClientName == "" {
		o.ClientName = cfg.UserAgent
		if o.ClientName == "" {
			o.ClientName = "wrapconfig"
		}
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = time.Second
	}
	t := &wrapTransport{c: c, o: o, requests: wrapRequests(o.Registerer), resets: wrapResets(o.Registerer),
		fresh: newFreshness(), pages: newPageCache(), left: newLeftovers(), held: &heldBudget{}, disc: &wrapDiscovery{c: c}}
	cfg.Wrap(func(next http.RoundTripper) http.RoundTripper {
		t := *t // one per transport client-go builds; they share the rest
		t.next = next
		return &t
	})
	return cfg
}

func wrapRequests(reg prometheus.Registerer) *prometheus.CounterVec {
	return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "informerd_client_wrap_requests_total",
		Help: "Requests through client.WrapConfig, by outcome (served, passed, fell_back, refused) and the reason one was not served.",
	}, []string{"outcome", "reason"}))
}

// The outcomes of informerd_client_wrap_resets_total.
const (
	resetCaughtUp = "caught_up" // answered with the changes (held.go)
	resetExpired  = "expired"   // answered with 410: the watch held nothing to compare with
)

func wrapResets(reg prometheus.Registerer) *prometheus.CounterVec {
	return register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "informerd_client_wrap_resets_total",
		Help: "RESETs of the daemon's streams that wrapped watches received, by outcome (caught_up: answered with the changes; expired: answered with 410).",
	}, []string{"outcome"}))
}

// register registers cv with reg, if set, or returns the collector of the
// same name already there.
func register(reg prometheus.Registerer, cv *prometheus.CounterVec) *prometheus.CounterVec {
	if reg == nil {
		return cv
	}
	if err := reg.Register(cv); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing
			}
		}
	}
	return cv
}

// wrapTransport is WrapConfig's RoundTripper.
type wrapTransport struct {
	c        *client.Client
	next     http.RoundTripper // cfg's own transport, with its credentials
	o        Options
	requests *prometheus.CounterVec
	resets   *prometheus.CounterVec
	disc     *wrapDiscovery
	// fresh keeps what was served and written, so that no answer is
	// older than either (fresh.go).
	fresh *freshness
	// pages keeps the snapshots of paginated lists (pages.go).
	pages *pageCache
	// left keeps what lists and watches left for the watches resuming
	// from them, and held counts what watches hold (held.go).
	left *leftovers
	held *heldBudget
}

// RoundTrip serves req from the daemon, or passes it through.
func (t *wrapTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	r, reason := parseRead(req)
	if r == nil && reason == reasonMethod {
		resp, err := t.pass(req, reason, nil)
		return t.fresh.noteWrite(req, resp), err
	}
	if r == nil {
		return t.pass(req, reason, nil)
	}
	if req.Body != nil && req.Body != http.NoBody { // a GET's, if any: RoundTrip closes it, and what is passed through reads nothing
		_ = req.Body.Close()
		req = req.Clone(req.Context())
		req.Body = http.NoBody
	}
	ctx := req.Context()
	if !t.c.Connected(ctx, t.o.DialTimeout) {
		resp, err := t.daemonError(req, r, status.Error(codes.Unavailable, "informerd is unreachable"))
		return t.observe(r, t.heldFor(r), resp, err)
	}
	res, err := t.disc.lookup(ctx, r.gvr)
	if err != nil {
		return t.daemonError(req, r, err)
	}
	verb := "list"
	if r.watch {
		verb = "watch"
	}
	switch {
	case res == nil || (r.namespace != "" && !res.GetNamespaced()):
		return t.passNotFound(req, r.gvr.GroupVersion())
	case !slices.Contains(res.GetVerbs(), verb):
		return t.pass(req, reasonNotServed, &apierrors.NewMethodNotSupported(r.gvr.GroupResource(), verb).ErrStatus)
	}
	gvk := r.gvr.GroupVersion().WithKind(res.GetKind())
	k := kindInfo{gvk: gvk, builtin: scheme.Scheme.Recognizes(gvk)}
	if r.format.protobuf && !r.format.metadata && !(k.builtin && protobufLayout(gvk)) {
		if !r.format.jsonFallback {
			return t.pass(req, reasonFormat, nil) // the API server's 406
		}
		r.format.protobuf = false // as the API server answers for a custom resource
	}
	if r.watch {
		return t.serveWatch(req, r, k)
	}
	return t.serveList(req, r, k)
}

// options returns the daemon's request for r, never older than what its
// informer served or this config wrote (fresh.go), and the informer.
func (t *wrapTransport) options(r *readRequest, k kindInfo) (client.WatchOptions, scope) {
	opts := client.WatchOptions{
		Resource: r.gvr, Namespace: r.namespace, LabelSelector: r.labelSelector, FieldSelector: r.fieldSelector,
		MetadataOnly: r.format.metadata, Protobuf: r.format.protobuf && !r.format.metadata && k.builtin,
		ClientName: t.o.ClientName, ExistingInformerOnly: oneOff(r, t.o),
	}
	sc := scope{gvr: r.gvr, namespace: r.namespace, fieldSelector: r.fieldSelector, protobuf: opts.Protobuf}
	min := t.fresh.floor(sc) // for a resumed watch too: the resume point is at least as new
	if n, err := strconv.ParseUint(r.resourceVersion, 10, 64); err == nil && (!r.watch || r.notOlderThan) {
		min = max(min, n) // a list's, or a WatchList's, resourceVersion is its minimum
	}
	if min > 0 {
		opts.NotOlderThan = strconv.FormatUint(min, 10)
	}
	return opts, sc
}

// oneOff reports whether r is a read the daemon serves only from an
// informer it already has: a list with a field selector (kubectl
// describe's events of one object, involvedObject.uid=X) or a watch of
// one object (kubectl get NAME -w, metadata.name=NAME) would otherwise
// start an informer that lingers, a watch at the API server that a direct
// read does not cost. An informer of every object serves one object's
// reads; the informer a watch with another selector starts (a node
// agent's spec.nodeName=NODE) serves such lists from then on. Strict
// configs never pass through, so they start it.
func oneOff(r *readRequest, o Options) bool {
	if r.fieldSelector == "" || o.Strict {
		return false
	}
	_, one := fieldsel.OneObject(r.fieldSelector, r.namespace)
	return !r.watch || one
}

// saw notes that sc's informer served rv.
func (t *wrapTransport) saw(sc scope, rv string) {
	if n, err := strconv.ParseUint(rv, 10, 64); err == nil {
		t.fresh.raise(sc, n)
	}
}

// serveList answers a list with the daemon's snapshot, once it reflects
// this config's writes (fresh.go).
func (t *wrapTransport) serveList(req *http.Request, r *readRequest, k kindInfo) (*http.Response, error) {
	ctx := req.Context()
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.timeout)
		defer cancel()
	}
	if r.cont != "" {
		return t.serveContinue(req, r, k)
	}
	opts, sc := t.options(r, k)
	deadline := time.Now().Add(freshnessRetry)
	for {
		objs, rv, err := t.snapshot(ctx, opts)
		if err != nil {
			return t.daemonError(req, r, err)
		}
		n, _ := strconv.ParseUint(rv, 10, 64)
		if sc.fieldSelector != "" && n < t.fresh.written(sc) {
			return t.pass(req, reasonStale, nil) // this informer may never receive the write's event
		}
		if held := t.fresh.check(sc, r.labelSelector == "", objs); len(held) > 0 {
			if time.Now().After(deadline) {
				return t.pass(req, reasonStale, nil)
			}
			opts.NotOlderThan = strconv.FormatUint(n+1, 10) // its deletion comes after: wait for a change
			continue
		}
		t.saw(sc, rv)
		l := &pagedList{objs: objs}
		limit := r.limit
		if r.resourceVersion == "0" {
			limit = 0 // the API server answers it whole, from its cache
		}
		resp, err := t.servePage(req, r, k, l, 0, limit, rv)
		if err == nil && resp.StatusCode == http.StatusOK {
			now := time.Now()
			if int64(len(objs)) > limit && limit > 0 {
				t.pages.add(t.pageKey(r, rv), l, sizeOf(objs), now)
			}
			t.left.add(t.pageKey(r, rv), &leftover{objs: objs}, sizeOf(objs), now) // for the watch resuming from it
		}
		return resp, err
	}
}

func (t *wrapTransport) pageKey(r *readRequest, rv string) pageKey {
	return pageKey{gvr: r.gvr, namespace: r.namespace, labelSelector: r.labelSelector, fieldSelector: r.fieldSelector, format: r.format, rv: rv}
}

// serveContinue answers a list's next page from the snapshot its token
// came from, or passes the token to the API server if the wrapper does
// not hold it (pages.go).
func (t *wrapTransport) serveContinue(req *http.Request, r *readRequest, k kindInfo) (*http.Response, error) {
	rv, start, ok := decodeContinue(r.cont)
	if !ok {
		return t.pass(req, reasonExactRV, nil)
	}
	l, ok := t.pages.get(t.pageKey(r, rv), time.Now())
	if !ok {
		return t.pass(req, reasonExactRV, nil)
	}
	from, ok := l.next(start)
	if !ok {
		return t.pass(req, reasonExactRV, nil)
	}
	return t.servePage(req, r, k, l, from, r.limit, rv)
}

// servePage answers with the page of l from index from.
func (t *wrapTransport) servePage(req *http.Request, r *readRequest, k kindInfo, l *pagedList, from int, limit int64, rv string) (*http.Response, error) {
	p, err := l.page(from, limit, rv, r.namespace, r.labelSelector != "" || r.fieldSelector != "")
	if err != nil {
		return t.pass(req, reasonEncoding, nil)
	}
	body, err := encodeList(r.format, k, p, rv)
	if err != nil {
		return t.pass(req, reasonEncoding, nil)
	}
	t.count(outcomeServed, "")
	return response(req, http.StatusOK, r.format.contentType(false), io.NopCloser(bytes.NewReader(body)), int64(len(body))), nil
}

// snapshot returns the objects of a daemon stream's snapshot and its
// resourceVersion.
func (t *wrapTransport) snapshot(ctx context.Context, opts client.WatchOptions) ([][]byte, string, error) {
	s, err := t.c.Stream(ctx, opts, "")
	if err != nil {
		return nil, "", err
	}
	defer s.Close()
	var objs [][]byte
	for {
		evs, err := s.Recv()
		if err != nil {
			return nil, "", err
		}
		for _, ev := range evs {
			switch ev.GetType() {
			case informerdv1.EventType_EVENT_TYPE_ADDED:
				objs = append(objs, ev.GetObject())
			case informerdv1.EventType_EVENT_TYPE_RESET:
				objs = objs[:0]
			case informerdv1.EventType_EVENT_TYPE_SYNCED:
				return objs, ev.GetResourceVersion(), nil
			}
		}
	}
}

func response(req *http.Request, code int, contentType string, body io.ReadCloser, length int64) *http.Response {
	return &http.Response{
		Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": []string{contentType}},
		Body:          body,
		ContentLength: length,
		Request:       req,
	}
}

// serveWatch answers a watch with a daemon stream, once the daemon has
// accepted it; the response's body owns the stream.
func (t *wrapTransport) serveWatch(req *http.Request, r *readRequest, k kindInfo) (*http.Response, error) {
	var (
		ctx      context.Context
		cancel   context.CancelFunc
		deadline time.Time
	)
	if r.timeout > 0 {
		deadline = time.Now().Add(r.timeout)
		ctx, cancel = context.WithDeadline(req.Context(), deadline)
	} else {
		ctx, cancel = context.WithCancel(req.Context())
	}
	opts, sc := t.options(r, k)
	initial := r.resourceVersion == "" || r.resourceVersion == "0" || (r.sendInitialEvents != nil && *r.sendInitialEvents)
	if initial && (len(t.fresh.pendingIn(sc, time.Now())) > 0 || (sc.fieldSelector != "" && t.fresh.floor(sc) < t.fresh.written(sc))) {
		cancel()
		return t.pass(req, reasonStale, nil) // the initial events might not reflect this config's writes yet
	}
	w := &wrapWatch{t: t, sc: sc, enc: watchEncoder{f: r.format, k: k}, bookmarks: r.allowBookmarks, resume: r.resourceVersion,
		last: r.resourceVersion, start: r.resourceVersion, told: r.resourceVersion, deadline: deadline, key: t.pageKey(r, "")}
	resume := ""
	switch {
	case r.sendInitialEvents != nil && *r.sendInitialEvents:
		w.watchList, w.initial = true, true
	case r.resourceVersion == "" || r.resourceVersion == "0":
		w.initial = true
		w.skipInitial = r.sendInitialEvents != nil // sendInitialEvents=false: from now, without them
	default:
		resume = r.resourceVersion
	}
	switch {
	case resume != "":
		w.held = t.heldFor(r)
	case !w.skipInitial:
		w.held = &held{objs: map[heldKey]heldObject{}} // the initial events fill it
	}
	s, err := t.c.Stream(ctx, opts, resume)
	if err == nil {
		err = s.Accepted()
	}
	if err != nil {
		cancel()
		h := w.held
		w.held = nil
		resp, err := t.daemonError(req, r, err)
		return t.observe(r, h, resp, err)
	}
	if resume != "" && s.Reset() != "" && !t.o.Strict && w.held == nil {
		// The daemon's informer does not hold the resume point, and this
		// watch does not know what its caller holds: the API server may
		// still serve it (a young cluster's RV 1), and answers 410 itself
		// if not.
		if s.Reset() == informerdv1.ResetLost {
			cancel()
			return t.pass(req, reasonResumeLost, nil)
		}
		// This watch started the informer (the daemon restarted, or the
		// reflector's list went to the API server as oneOff): the stream
		// keeps it while the API server serves the watch, so that the
		// reflector's next watch resumes from it.
		return t.passHolding(req, s, cancel)
	}
	pr, pw := io.Pipe()
	w.s, w.out = s, pw
	go w.run(ctx, cancel) // ends when the stream does, or the body is closed
	t.count(outcomeServed, "")
	return response(req, http.StatusOK, r.format.contentType(true), &watchBody{PipeReader: pr, cancel: cancel}, -1), nil
}

// passHolding passes the watch req through, and keeps the daemon's
// stream s, whose informer it holds, open until the response's body is
// closed or ends; what s sends is discarded. cancel ends s.
func (t *wrapTransport) passHolding(req *http.Request, s *client.Stream, cancel context.CancelFunc) (*http.Response, error) {
	resp, err := t.pass(req, reasonResumeNew, nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		cancel()
		return resp, err
	}
	go func() { // ends with s, which cancel ends
		for {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}()
	resp.Body = &holdingBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// holdingBody is a passed-through watch's body that ends the daemon
// stream beside it once it ends or is closed.
type holdingBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *holdingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.cancel()
	}
	return n, err
}

func (b *holdingBody) Close() error {
	b.cancel()
	return b.ReadCloser.Close()
}

// watchBody is a watch response's body: closing it ends the stream.
type watchBody struct {
	*io.PipeReader
	cancel context.CancelFunc
}

func (b *watchBody) Close() error {
	b.cancel()
	return b.PipeReader.Close()
}

// wrapWatch translates one daemon stream into a watch response.
type wrapWatch struct {
	t   *wrapTransport
	sc  scope
	enc watchEncoder
	s   *client.Stream
	out *io.PipeWriter

	resume      string    // the request's resourceVersion
	last        string    // the newest resourceVersion of the watch: the position of a bookmark
	told        string    // the last position sent to the caller, where its reflector resumes
	key         pageKey   // the request's shape, for what it leaves (without a position)
	start       string    // where the watch started: the resume point, or its snapshot's
	deadline    time.Time // timeoutSeconds' end; zero: none
	expired     bool      // a RESET ended the watch: discard the snapshot, then answer 410
	bookmarks   bool      // allowWatchBookmarks
	watchList   bool      // sendInitialEvents=true: end the initial events with the initial-events-end bookmark
	initial     bool      // the stream starts with a snapshot, until SYNCED
	skipInitial bool      // sendInitialEvents=false: do not send the snapshot

	// held is what the caller holds (held.go): nil when not known, and a
	// RESET ends the watch with 410; fresh collects the snapshot after a
	// RESET until its SYNCED.
	held, fresh *held
}

// bookmarkLead is how long before timeoutSeconds ends a watch the API
// server sends a bookmark to a watch that allows them (k8s.io/apiserver's
// cacheWatcher.nextBookmarkTime: 2s before the deadline).
const bookmarkLead = 2 * time.Second

// run writes the stream's events to the body until the stream ends, which
// ends the body as the API server ends a watch: cleanly, after an ERROR
// event for a resume point the daemon no longer has (410 Expired), and
// with allowWatchBookmarks a bookmark bookmarkLead before timeoutSeconds
// ends it. The caller's reflector then watches again from where it was.
// A goroutine of its own receives from the stream; it ends with ctx,
// which run cancels when it returns.
func (w *wrapWatch) run(ctx context.Context, cancel context.CancelFunc) {
	defer w.out.Close()
	defer cancel()
	defer w.leave() // before the caller sees the end, and watches again

	type batch struct {
		evs []*informerdv1.Event
		err error
	}
	batches := make(chan batch) // unbuffered: one batch at a time
	go func() {
		for {
			evs, err := w.s.Recv() // ends with ctx
			select {
			case batches <- batch{evs, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var pretimeout <-chan time.Time
	if w.bookmarks && !w.deadline.IsZero() {
		if d := time.Until(w.deadline.Add(-bookmarkLead)); d > 0 {
			t := time.NewTimer(d)
			defer t.Stop()
			pretimeout = t.C
		}
	}
	for {
		select {
		case b := <-batches:
			if b.err != nil {
				if w.expired { // the stream ended before the snapshot's end
					w.writeExpired("")
				}
				return // the daemon ended the stream, or went away: as a watch that ends
			}
			for _, ev := range b.evs {
				b, end, err := w.translate(ev)
				if err == nil && b != nil {
					_, err = w.out.Write(b)
				}
				if err != nil || end {
					return
				}
			}
		case <-pretimeout:
			pretimeout = nil
			if w.initial || w.expired || !newer(w.last, w.start) {
				// As the API server's watch cache, which sends a watcher
				// only what is newer than where it started.
				continue
			}
			b, err := w.enc.bookmark(w.last, false)
			if err == nil {
				_, err = w.out.Write(b)
			}
			if err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// writeExpired writes the API server's 410 for the watch: "too old
// resource version: X (Y)", X the watch's last position and Y (if known)
// the one it could resume from now (k8s.io/apiserver's watch cache names
// its oldest).
func (w *wrapWatch) writeExpired(now string) {
	msg := "too old resource version: " + w.last
	if now != "" {
		msg += " (" + now + ")"
	}
	st := apierrors.NewResourceExpired(msg).ErrStatus
	if b, err := w.enc.errorEvent(&st); err == nil {
		_, _ = w.out.Write(b)
	}
}

// translate returns the frames for one event (nil for none), and whether
// the watch ends after them.
func (w *wrapWatch) translate(ev *informerdv1.Event) ([]byte, bool, error) {
	rv := ev.GetResourceVersion()
	if w.expired { // reading to the snapshot's end for its resourceVersion
		if ev.GetType() == informerdv1.EventType_EVENT_TYPE_SYNCED {
			w.writeExpired(rv)
			return nil, true, nil
		}
		return nil, false, nil
	}
	var t string
	switch ev.GetType() {
	case informerdv1.EventType_EVENT_TYPE_ADDED:
		t = "ADDED"
	case informerdv1.EventType_EVENT_TYPE_MODIFIED:
		t = "MODIFIED"
	case informerdv1.EventType_EVENT_TYPE_DELETED:
		t = "DELETED"
	case informerdv1.EventType_EVENT_TYPE_SYNCED:
		if w.fresh != nil {
			return w.catchUp(rv)
		}
		initial := w.initial
		w.initial = false
		w.t.saw(w.sc, rv)
		w.advance(rv)
		if initial {
			w.start = rv
		}
		if !initial || !w.watchList {
			return nil, false, nil
		}
		w.told = rv
		b, err := w.enc.bookmark(rv, true)
		return b, false, err
	case informerdv1.EventType_EVENT_TYPE_BOOKMARK:
		if rv == "" || w.initial || w.fresh != nil {
			return nil, false, nil
		}
		w.t.saw(w.sc, rv)
		w.advance(rv)
		if !w.bookmarks || !newer(rv, w.start) { // the watch cache sends only what is newer than the start
			return nil, false, nil
		}
		w.told = rv
		b, err := w.enc.bookmark(rv, false)
		return b, false, err
	case informerdv1.EventType_EVENT_TYPE_RESET:
		switch {
		case w.initial:
			return nil, false, nil // a snapshot follows, which is what was asked for
		case w.held != nil:
			w.fresh = &held{objs: map[heldKey]heldObject{}} // read the snapshot to its end, then send the changes
			return nil, false, nil
		}
		w.t.resets.WithLabelValues(resetExpired).Inc()
		w.expired = true // the 410 names the snapshot's resourceVersion: read to its end
		return nil, false, nil
	default:
		return nil, false, nil
	}
	if w.fresh != nil { // the snapshot after a RESET: ADDED only
		if err := w.fresh.put(ev.GetObject()); err != nil {
			return w.internalError(err)
		}
		return nil, false, nil
	}
	if w.initial && w.skipInitial {
		return nil, false, nil
	}
	b, err := w.enc.event(t, ev.GetObject())
	if err != nil {
		return w.internalError(err)
	}
	w.delivered(t, ev.GetObject())
	if !w.initial {
		w.t.saw(w.sc, rv)
		w.advance(rv)
		w.told = rv
	}
	return b, false, nil
}

// catchUp ends the snapshot after a RESET (rv is its SYNCED's): it
// returns the frames of the changes from what the caller holds to the
// snapshot, deletions stamped with the last position the caller was told,
// then, if the caller takes them, a bookmark at the snapshot.
func (w *wrapWatch) catchUp(rv string) ([]byte, bool, error) {
	deletedAt := w.told
	if deletedAt == "" || deletedAt == "0" {
		deletedAt = rv
	}
	changes, err := w.held.changesTo(w.fresh, deletedAt)
	if err != nil {
		return w.internalError(err)
	}
	var out []byte
	for _, c := range changes {
		b, err := w.enc.event(c.typ, c.raw)
		if err != nil {
			return w.internalError(err)
		}
		out = append(out, b...)
		w.told = c.rv
	}
	fresh := w.fresh
	w.fresh = nil
	w.release()
	if w.t.held.take(fresh.bytes) {
		w.held = fresh
	}
	w.t.resets.WithLabelValues(resetCaughtUp).Inc()
	w.t.saw(w.sc, rv)
	w.advance(rv)
	if w.bookmarks && newer(rv, w.start) && rv != "" {
		b, err := w.enc.bookmark(rv, false)
		if err != nil {
			return nil, true, err
		}
		out = append(out, b...)
		w.told = rv
	}
	return out, false, nil
}

// internalError returns the frame of the API server's 500 for err, which
// ends the watch.
func (w *wrapWatch) internalError(err error) ([]byte, bool, error) {
	st := apierrors.NewInternalError(fmt.Errorf("informerd: %w", err)).ErrStatus
	b, err := w.enc.errorEvent(&st)
	return b, true, err
}

// delivered notes that the caller was sent an event of type t of obj.
func (w *wrapWatch) delivered(t string, obj []byte) {
	if w.held == nil {
		return
	}
	before := w.held.bytes
	var err error
	if t == "DELETED" {
		err = w.held.remove(obj)
	} else {
		err = w.held.put(obj)
	}
	if d := w.held.bytes - before; err != nil || !w.t.held.take(d) {
		w.held.bytes = before // what the budget counts
		w.release()           // what the caller holds is no longer known
	}
}

// release gives back what the watch holds.
func (w *wrapWatch) release() {
	if w.held != nil {
		w.t.held.give(w.held.bytes)
		w.held = nil
	}
}

// leave keeps what the caller holds for the watch that resumes from the
// last position it was told, which its reflector starts at once.
func (w *wrapWatch) leave() {
	h := w.held
	w.release()
	if h == nil || w.initial || w.told == "" || w.told == "0" {
		return
	}
	k := w.key
	k.rv = w.told
	w.t.left.add(k, &leftover{h: h}, h.bytes, time.Now())
}

// advance notes rv as the watch's newest position, if it is newer.
func (w *wrapWatch) advance(rv string) {
	if newer(rv, w.last) {
		w.last = rv
	}
}

// newer reports whether resourceVersion a is a number greater than b, or
// b is not a number.
func newer(a, b string) bool {
	n, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return false
	}
	m, err := strconv.ParseUint(b, 10, 64)
	return err != nil || n > m
}

// daemonError answers a request that the daemon refused or could not
// answer with err: passed through (by default) or, with Strict, the
// Status the API server would send.
func (t *wrapTransport) daemonError(req *http.Request, r *readRequest, err error) (*http.Response, error) {
	if ctxErr := req.Context().Err(); ctxErr != nil {
		return nil, ctxErr
	}
	st := status.Convert(err)
	reason, md, retryAfter := "", map[string]string(nil), 1
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == informerdv1.ErrorDomain {
				reason, md = d.GetReason(), d.GetMetadata()
			}
		case *errdetails.RetryInfo: // the daemon's per-caller budgets
			retryAfter = max(1, int(math.Ceil(d.GetRetryDelay().AsDuration().Seconds())))
		}
	}
	user := md[informerdv1.MetadataUser]
	msg := "informerd: " + st.Message()
	switch st.Code() {
	case codes.Unavailable:
		if reason == informerdv1.ReasonTooNew && !r.watch && md[informerdv1.MetadataWantResourceVersion] == r.resourceVersion {
			// The caller's own resourceVersion, not reached in the 3s the
			// API server's watch cache also waits: its answer, on which
			// the caller retries after a second.
			t.count(outcomeServed, "")
			return statusResponse(req, tooLargeResourceVersion(r.resourceVersion, md[informerdv1.MetadataCurrentResourceVersion]))
		}
		if reason == informerdv1.ReasonCRDTerminating {
			// The API server serves the resource until the CRD's
			// finalizers are done, then answers 404: only it can say
			// which. Strict: 503, as while the daemon is unavailable.
			return t.pass(req, reasonTerminating, &apierrors.NewServiceUnavailable(msg).ErrStatus)
		}
	case codes.NotFound:
		return t.passNotFound(req, r.gvr.GroupVersion())
	case codes.PermissionDenied:
		if reason == informerdv1.ReasonSensitive {
			return t.pass(req, reasonSensitive, forbidden(r, user, msg))
		}
		return t.pass(req, reasonDenied, forbidden(r, user, ""))
	case codes.InvalidArgument:
		return t.pass(req, reasonRejected, &apierrors.NewBadRequest(msg).ErrStatus)
	case codes.FailedPrecondition: // no informer for a oneOff read
		return t.pass(req, reasonOneOff, nil)
	case codes.ResourceExhausted:
		return t.pass(req, reasonExhausted, &apierrors.NewTooManyRequests(msg, retryAfter).ErrStatus)
	case codes.Unauthenticated:
		return t.pass(req, reasonAuth, &apierrors.NewUnauthorized(msg).ErrStatus)
	}
	if t.o.Strict {
		return t.refuse(req, reasonUnavailable, &apierrors.NewServiceUnavailable(msg).ErrStatus)
	}
	t.count(outcomeFellBack, reasonUnavailable)
	return t.next.RoundTrip(req)
}

// passNotFound passes req, for a resource the API server does not serve
// in gv, through, or with Strict answers the API server's 404: a Status
// where it serves gv with its built-in handlers (client-go's built-in
// group versions), and elsewhere (custom resources, a deleted CRD's
// included, and group versions it does not serve) its mux's answer, Go's
// "404 page not found".
func (t *wrapTransport) passNotFound(req *http.Request, gv schema.GroupVersion) (*http.Response, error) {
	if !t.o.Strict || scheme.Scheme.IsVersionRegistered(gv) {
		return t.pass(req, reasonNotServed, notFound())
	}
	t.count(outcomeRefused, reasonNotServed)
	if req.Body != nil {
		_ = req.Body.Close() // RoundTrip closes the body, even on errors
	}
	const body = "404 page not found\n"
	resp := response(req, http.StatusNotFound, "text/plain; charset=utf-8", io.NopCloser(strings.NewReader(body)), int64(len(body)))
	resp.Header.Set("X-Content-Type-Options", "nosniff")
	return resp, nil
}

// notFound is the API server's answer for a resource it does not serve in
// a group version of its built-in handlers.
func notFound() *metav1.Status {
	return &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
		Message: "the server could not find the requested resource", Details: &metav1.StatusDetails{}}
}

// forbidden is the API server's answer for a request its authorizer
// denies (k8s.io/apiserver's responsewriters.ForbiddenStatusError), for
// user, or with msg when the daemon refused the resource itself.
func forbidden(r *readRequest, user, msg string) *metav1.Status {
	verb := "list"
	if r.watch {
		verb = "watch"
	}
	if msg == "" {
		msg = fmt.Sprintf("User %q cannot %s resource %q in API group %q at the cluster scope", user, verb, r.gvr.Resource, r.gvr.Group)
		if r.namespace != "" {
			msg = fmt.Sprintf("User %q cannot %s resource %q in API group %q in the namespace %q", user, verb, r.gvr.Resource, r.gvr.Group, r.namespace)
		}
	}
	return &apierrors.NewForbidden(r.gvr.GroupResource(), "", errors.New(msg)).ErrStatus
}

// pass passes req through to the API server, or with Strict refuses it:
// with strict, the Status the API server would send, or (nil) an error.
func (t *wrapTransport) pass(req *http.Request, reason string, strict *metav1.Status) (*http.Response, error) {
	if t.o.Strict {
		return t.refuse(req, reason, strict)
	}
	t.count(outcomePassed, reason)
	return t.next.RoundTrip(req)
}

// ErrNotServed is the error of a request that a Strict WrapConfig does
// not pass through.
var ErrNotServed = errors.New("informerd WrapConfig (strict): the daemon does not serve this request")

func (t *wrapTransport) refuse(req *http.Request, reason string, st *metav1.Status) (*http.Response, error) {
	t.count(outcomeRefused, reason)
	if req.Body != nil {
		_ = req.Body.Close() // RoundTrip closes the body, even on errors
	}
	if st == nil {
		if reason == reasonImpersonate {
			reason += ": the daemon reads as its own token, so only the API server can decide what an impersonated user may read"
		}
		return nil, fmt.Errorf("%w: %s %s (%s)", ErrNotServed, req.Method, req.URL.Path, reason)
	}
	return statusResponse(req, st)
}

// tooLargeResourceVersion is the API server's answer for a list at a
// resourceVersion its watch cache has not reached in 3s (k8s.io/apiserver's
// storage.NewTooLargeResourceVersionError): 504, retry after a second.
func tooLargeResourceVersion(want, current string) *metav1.Status {
	st := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %s, current: %s", want, current), 1).ErrStatus
	st.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	return &st
}

// statusResponse answers req with st, as the API server writes a Status.
func statusResponse(req *http.Request, st *metav1.Status) (*http.Response, error) {
	f, _ := negotiate(req.Header.Values("Accept"), false)
	f.metadata = false
	body, err := encodeStatus(f, st)
	if err != nil {
		return nil, err
	}
	resp := response(req, int(st.Code), f.contentType(false), io.NopCloser(bytes.NewReader(body)), int64(len(body)))
	switch {
	case st.Details != nil && st.Details.RetryAfterSeconds > 0:
		resp.Header.Set("Retry-After", strconv.Itoa(int(st.Details.RetryAfterSeconds)))
	case st.Code == http.StatusTooManyRequests:
		resp.Header.Set("Retry-After", "1")
	}
	return resp, nil
}

func (t *wrapTransport) count(outcome, reason string) {
	t.requests.WithLabelValues(outcome, reason).Inc()
}

// wrapDiscovery knows the resources the API server serves, from the
// daemon's discovery, refreshed for a resource it does not know.
type wrapDiscovery struct {
	c *client.Client

	mu        sync.Mutex // guards resources
	resources map[schema.GroupVersionResource]*informerdv1.APIResource
}

// lookup returns gvr's discovery, or nil if the API server does not serve
// it (under that exact name: the daemon's resolution of singular and short
// names is not the API server's).
func (d *wrapDiscovery) lookup(ctx context.Context, gvr schema.GroupVersionResource) (*informerdv1.APIResource, error) {
	d.mu.Lock()
	res, ok := d.resources[gvr]
	d.mu.Unlock()
	if ok {
		return res, nil
	}
	resp, err := d.c.API().GetDiscovery(ctx, &informerdv1.GetDiscoveryRequest{Resource: &informerdv1.GroupVersionResource{
		Group: gvr.Group, Version: gvr.Version, Resource: gvr.Resource}})
	if status.Code(err) == codes.NotFound {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	m := map[schema.GroupVersionResource]*informerdv1.APIResource{}
	for _, g := range resp.GetGroups() {
		for _, v := range g.GetVersions() {
			for _, r := range v.GetResources() {
				m[schema.GroupVersionResource{Group: g.GetName(), Version: v.GetVersion(), Resource: r.GetName()}] = r
			}
		}
	}
	d.mu.Lock()
	d.resources = m
	d.mu.Unlock()
	return m[gvr], nil
}

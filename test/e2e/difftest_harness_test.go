package e2e

import (
	"bytes"
	"context"
	encbinary "encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// This file is the differential test's harness: it sends one request shape
// to several targets (the API server, WrapConfig, informerctl proxy) and
// reduces each answer to a view whose sections can be compared.

// shape is one request of the differential table.
type shape struct {
	name   string
	path   string // escaped, as sent: odd paths are sent as they are
	query  string // raw query, as sent
	accept string // Accept; "" is application/json
	header http.Header
	// who is the identity: "" the admin, "restricted" a ServiceAccount that
	// may read ConfigMaps in one namespace only.
	who string
	// pages follows continue tokens (each target its own) until the last page.
	pages bool
	// prep, if set, returns a query suffix computed once for every target
	// (for example a continue token the API server issued).
	prep func(ctx context.Context, t *testing.T) string
}

// target is one way to the same API: its base URL and HTTP client.
type target struct {
	name string
	base string
	hc   *http.Client
	reg  *prometheus.Registry // WrapConfig's counters, if it is WrapConfig
}

// outcomes returns WrapConfig's requests so far by outcome (served,
// passed, fell_back, refused); none for other targets.
func (tg *target) outcomes() map[string]float64 {
	out := map[string]float64{}
	if tg.reg == nil {
		return out
	}
	for _, o := range []string{"served", "passed", "fell_back", "refused"} {
		out[o] = wrapCount(tg.reg, o)
	}
	return out
}

// newTarget returns a target that sends requests with cfg's transport (the
// API server's credentials, or WrapConfig's transport) to cfg.Host, or to
// base if set. Redirects are returned, not followed: they are part of what
// is compared.
func newTarget(t *testing.T, name string, cfg *rest.Config, base string) *target {
	t.Helper()
	var hc *http.Client
	if cfg != nil {
		var err error
		if hc, err = rest.HTTPClientFor(cfg); err != nil {
			t.Fatal(err)
		}
		base = strings.TrimSuffix(cfg.Host, "/")
	} else {
		hc = &http.Client{Transport: &http.Transport{}}
		t.Cleanup(hc.CloseIdleConnections)
	}
	c := *hc
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &target{name: name, base: base, hc: &c}
}

// requestDeadline bounds one request: every watch shape carries a
// timeoutSeconds of at most 3, and a list at a future resourceVersion
// takes the API server 3 s (the daemon's wait may come on top).
const requestDeadline = 12 * time.Second

// view is what a target answered, reduced to named sections of lines.
type view map[string][]string

func (v view) add(section string, lines ...string) { v[section] = append(v[section], lines...) }

// addEvent adds a watch event's line, a BOOKMARK only if the line before
// is not the same: when bookmarks come is the server's choice (the API
// server sends one about every minute of a watch, and one before
// timeoutSeconds ends it; the daemon also forwards its informer's), and a
// client can tell only that one came and where it points.
func (v view) addEvent(section, line string) {
	if evs := v[section]; strings.HasPrefix(line, "BOOKMARK ") && len(evs) > 0 && evs[len(evs)-1] == line {
		return
	}
	v.add(section, line)
}

// do sends s to tg (following continue tokens if s.pages) and returns its view.
func (tg *target) do(ctx context.Context, s shape, extra string, floor uint64) view {
	v := view{}
	query := s.query
	if extra != "" {
		query = strings.TrimPrefix(query+"&"+extra, "&")
	}
	for page := 1; ; page++ {
		prefix := ""
		if s.pages {
			prefix = fmt.Sprintf("page %d ", page)
		}
		cont := tg.once(ctx, s, query, prefix, floor, v)
		if !s.pages || cont == "" || page == 10 {
			return v
		}
		q := strings.TrimPrefix(regexp.MustCompile(`(^|&)continue=[^&]*`).ReplaceAllString(query, ""), "&")
		query = strings.TrimPrefix(q+"&continue="+urlQueryEscape(cont), "&")
	}
}

func urlQueryEscape(s string) string {
	return strings.NewReplacer("%", "%25", "&", "%26", "+", "%2B", "=", "%3D", "/", "%2F").Replace(s)
}

// once sends one request and adds its view to v under prefix; it returns
// the list's continue token, if any.
func (tg *target) once(ctx context.Context, s shape, query, prefix string, floor uint64, v view) string {
	ctx, cancel := context.WithTimeout(ctx, requestDeadline)
	defer cancel()
	u := tg.base + s.path
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		v.add(prefix+"error", err.Error())
		return ""
	}
	accept := s.accept
	if accept == "" {
		accept = "application/json"
	}
	req.Header.Set("Accept", accept)
	for k, vs := range s.header {
		req.Header[k] = vs
	}
	resp, err := tg.hc.Do(req)
	if err != nil {
		v.add(prefix+"error", "transport: "+err.Error())
		return ""
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	ended := "by the server"
	if err != nil {
		ended = "by the client's deadline"
		if !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			ended = "with " + err.Error()
		}
	}
	v.add(prefix+"status", strconv.Itoa(resp.StatusCode))
	for _, h := range []string{"Content-Type", "Retry-After", "Warning", "Location"} {
		if got := resp.Header.Values(h); len(got) > 0 {
			v.add(prefix+"headers", h+": "+strings.Join(got, ", "))
		}
	}
	return parseBody(body, resp.Header.Get("Content-Type"), ended, prefix, floor, v)
}

// diffScheme decodes protobuf answers: the built-in types and meta.k8s.io's
// PartialObjectMetadata(List) and Table.
var diffScheme = func() runtime.Decoder {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		panic(err)
	}
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	if err := metav1.AddMetaToScheme(s); err != nil {
		panic(err)
	}
	return serializer.NewCodecFactory(s).UniversalDeserializer()
}()

var protobufMagic = []byte("k8s\x00")

// parseBody adds the sections of body: a document (list, object, Status,
// Table) or a stream of watch events, in JSON or protobuf; other bodies
// (YAML, text) are compared as they are, but for their resourceVersions.
func parseBody(body []byte, contentType, ended, prefix string, floor uint64, v view) string {
	isProtobuf := strings.HasPrefix(contentType, "application/vnd.kubernetes.protobuf")
	switch {
	case len(bytes.TrimSpace(body)) == 0: // a watch without events
		v.add(prefix+"end", ended)
		return ""
	case isProtobuf && bytes.HasPrefix(body, protobufMagic):
		js, err := protoToJSON(body)
		if err != nil {
			v.add(prefix+"body", "protobuf: "+err.Error())
			return ""
		}
		return document(js, false, prefix, floor, v)
	case !isProtobuf && bytes.HasPrefix(bytes.TrimSpace(body), []byte("{")):
		dec := json.NewDecoder(bytes.NewReader(body))
		var docs []json.RawMessage
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				if !errors.Is(err, io.EOF) {
					v.add(prefix+"end", "a truncated JSON value")
				}
				break
			}
			docs = append(docs, raw)
		}
		if len(docs) == 1 && !isEvent(docs[0]) {
			return document(docs[0], true, prefix, floor, v)
		}
		for _, d := range docs {
			var ev struct {
				Type   string          `json:"type"`
				Object json.RawMessage `json:"object"`
			}
			_ = json.Unmarshal(d, &ev)
			v.addEvent(prefix+"events", watchEventLine(ev.Type, ev.Object, floor))
		}
		v.add(prefix+"end", ended)
		return ""
	case isProtobuf:
		// Watch frames: a 4-byte big-endian length and a raw protobuf
		// metav1.WatchEvent whose object is a protobuf document.
		for len(body) >= 4 {
			n := int(encbinary.BigEndian.Uint32(body))
			if len(body) < 4+n {
				v.add(prefix+"end", "a truncated frame")
				break
			}
			var ev metav1.WatchEvent
			if err := ev.Unmarshal(body[4 : 4+n]); err != nil {
				v.add(prefix+"events", "undecodable frame: "+err.Error())
				break
			}
			body = body[4+n:]
			js, err := protoToJSON(ev.Object.Raw)
			if err != nil {
				v.add(prefix+"events", ev.Type+" undecodable object: "+err.Error())
				continue
			}
			v.addEvent(prefix+"events", watchEventLine(ev.Type, js, floor))
		}
		v.add(prefix+"end", ended)
		return ""
	}
	text := yamlRV.ReplaceAllString(string(body), "${1}<rv>")
	if len(text) > 2000 {
		text = text[:2000] + "..."
	}
	v.add(prefix+"body", strconv.Quote(text))
	if ended != "by the server" {
		v.add(prefix+"end", ended)
	}
	return ""
}

func isEvent(raw json.RawMessage) bool {
	keys := topKeys(raw)
	return len(keys) == 2 && slices.Contains(keys, "type") && slices.Contains(keys, "object")
}

func protoToJSON(b []byte) (json.RawMessage, error) {
	obj, _, err := diffScheme.Decode(b, nil, nil)
	if err != nil {
		return nil, err
	}
	return json.Marshal(obj)
}

// topKeys returns the keys of a JSON object in the order they were sent.
func topKeys(raw json.RawMessage) []string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return keys
		}
		keys = append(keys, fmt.Sprint(tok))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return keys
		}
	}
	return keys
}

// normalise is the one place where answers are made comparable. Only what
// must legitimately differ between the API server and the daemon is
// rewritten:
//   - a list's (or a bookmark's) own resourceVersion: each answer is taken
//     at its own moment, so the values differ; what must hold is checked
//     instead: it is a number at least the floor (the last write of the
//     fixture, which every consistent read must include);
//   - a continue token's value: each server issues its own; whether one is
//     there, and what the pages hold, is compared;
//   - the current resourceVersion quoted in a Status message ("too old
//     resource version: X (Y)", "Too large resource version: X, current:
//     Y") and an age in a Table's cells: time;
//   - every resourceVersion in a body that is neither JSON nor protobuf
//     (YAML: the list's and its objects' alike; the objects themselves are
//     compared in JSON by the other shapes).
//
// Everything else is compared byte for byte: objects (managedFields
// included), key order of envelopes, order of items and events.
func normaliseRV(rv string, floor uint64) string {
	if rv == "" {
		return ""
	}
	n, err := strconv.ParseUint(rv, 10, 64)
	switch {
	case err != nil:
		return "not a number: " + rv
	case floor > 0 && n < floor:
		return fmt.Sprintf("%d, older than the writes before it (%d)", n, floor)
	}
	return "<rv>"
}

var (
	statusRV = regexp.MustCompile(`\((\d+)\)|current: \d+`)
	yamlRV   = regexp.MustCompile(`(resourceVersion: "?)\d+`)
	tableAge = regexp.MustCompile(`"\d+(s|m|h|d)(\d+(s|m|h))?"`)
)

// document adds the sections of one JSON document; withOrder says whether
// the key order is the server's (JSON) rather than the decoder's (protobuf).
func document(raw json.RawMessage, withOrder bool, prefix string, floor uint64, v view) string {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		v.add(prefix+"body", "not an object: "+string(raw))
		return ""
	}
	var kind string
	_ = json.Unmarshal(doc["kind"], &kind)
	if withOrder {
		v.add(prefix+"envelope", strings.Join(topKeys(raw), ","))
	}
	v.add(prefix+"kind", kind)
	items, isList := doc["items"]
	rows, isTable := doc["rows"]
	if !isList && !isTable {
		body := compact(raw)
		if kind == "Status" {
			body = normaliseStatus(body)
		}
		v.add(prefix+"body", body)
		return ""
	}
	var meta map[string]json.RawMessage
	_ = json.Unmarshal(doc["metadata"], &meta)
	if withOrder {
		v.add(prefix+"envelope", "metadata: "+strings.Join(topKeys(doc["metadata"]), ","))
	}
	var rv, cont string
	_ = json.Unmarshal(meta["resourceVersion"], &rv)
	_ = json.Unmarshal(meta["continue"], &cont)
	v.add(prefix+"meta", "resourceVersion "+normaliseRV(rv, floor))
	switch c, ok := meta["continue"]; {
	case !ok:
	case cont == "":
		v.add(prefix+"meta", "continue "+string(c))
	default:
		v.add(prefix+"meta", "continue <token>")
	}
	if r, ok := meta["remainingItemCount"]; ok {
		v.add(prefix+"meta", "remainingItemCount "+string(r))
	}
	for k := range meta {
		if k != "resourceVersion" && k != "continue" && k != "remainingItemCount" {
			v.add(prefix+"meta", k+" "+string(meta[k]))
		}
	}
	if isTable {
		var rs []json.RawMessage
		_ = json.Unmarshal(rows, &rs)
		for _, r := range rs {
			v.add(prefix+"rows", tableAge.ReplaceAllString(compact(r), `"<age>"`))
		}
		return cont
	}
	var is []json.RawMessage
	_ = json.Unmarshal(items, &is)
	if len(is) == 0 {
		v.add(prefix+"items", "(none: "+string(items)+")")
	}
	for _, it := range is {
		v.add(prefix+"items", objectKey(it)+"\t"+compact(it))
	}
	return cont
}

// normaliseStatus replaces the current resourceVersion in a Status's message.
func normaliseStatus(s string) string {
	return statusRV.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasPrefix(m, "current: ") {
			return "current: <rv>"
		}
		return "(<rv>)"
	})
}

func compact(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

func objectKey(raw json.RawMessage) string {
	var o struct {
		Metadata struct{ Namespace, Name string } `json:"metadata"`
	}
	_ = json.Unmarshal(raw, &o)
	if o.Metadata.Namespace == "" {
		return o.Metadata.Name
	}
	return o.Metadata.Namespace + "/" + o.Metadata.Name
}

// watchEventLine is one watch event's line: objects compared whole, bookmarks by
// their annotations (their resourceVersion normalised), errors by their
// Status.
func watchEventLine(typ string, obj json.RawMessage, floor uint64) string {
	switch typ {
	case "BOOKMARK":
		var o struct {
			Metadata struct {
				ResourceVersion string            `json:"resourceVersion"`
				Annotations     map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		_ = json.Unmarshal(obj, &o)
		return fmt.Sprintf("BOOKMARK rv %s annotations %v", normaliseRV(o.Metadata.ResourceVersion, 0), o.Metadata.Annotations)
	case "ERROR":
		return "ERROR " + normaliseStatus(compact(obj))
	}
	return typ + " " + objectKey(obj) + "\t" + compact(obj)
}

// sections lists v's sections in a stable order.
func (v view) sections() []string {
	return slices.Sorted(maps.Keys(v))
}

// differences names how got differs from want, one entry per kind of
// difference, in words a reader can act on: a page missing, items missing
// or out of order, a field that differs in which objects.
func differences(want, got view) []string {
	var out []string
	pages := func(v view) map[string]bool {
		ps := map[string]bool{}
		for sec := range v {
			if p, _, ok := strings.Cut(sec, " status"); ok && strings.HasPrefix(sec, "page ") {
				ps[p] = true
			}
		}
		return ps
	}
	wp, gp := pages(want), pages(got)
	for _, sec := range slices.Compact(slices.Sorted(func(yield func(string) bool) {
		for k := range want {
			if !yield(k) {
				return
			}
		}
		for k := range got {
			if !yield(k) {
				return
			}
		}
	})) {
		if page, _, ok := strings.Cut(sec, " "); ok && page == "page" {
			p := strings.Join(strings.Fields(sec)[:2], " ")
			switch {
			case wp[p] && !gp[p]:
				if strings.HasSuffix(sec, " status") {
					out = append(out, p+": missing")
				}
				continue
			case gp[p] && !wp[p]:
				if strings.HasSuffix(sec, " status") {
					out = append(out, p+": not sent by the API server")
				}
				continue
			}
		}
		w, g := want[sec], got[sec]
		if slices.Equal(w, g) {
			continue
		}
		if strings.HasSuffix(sec, "items") || strings.HasSuffix(sec, "events") {
			for _, d := range lineDiff(w, g) {
				out = append(out, sec+": "+d)
			}
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s, API server %s", sec, short(strings.Join(g, " | ")), short(strings.Join(w, " | "))))
	}
	return out
}

func short(s string) string {
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// lineDiff compares item or event lines "KEY\tJSON": the keys and their
// order, then for each field that differs, the objects it differs in.
func lineDiff(want, got []string) []string {
	keys := func(ls []string) []string {
		var ks []string
		for _, l := range ls {
			k, _, _ := strings.Cut(l, "\t")
			ks = append(ks, k)
		}
		return ks
	}
	wk, gk := keys(want), keys(got)
	if !slices.Equal(wk, gk) {
		if slices.Equal(slices.Sorted(slices.Values(wk)), slices.Sorted(slices.Values(gk))) {
			return []string{fmt.Sprintf("the same in another order: %q, API server %q", gk, wk)}
		}
		return []string{fmt.Sprintf("%q, API server %q", gk, wk)}
	}
	byPath := map[string][]string{} // a difference -> the objects it is in
	for i := range want {
		_, wj, _ := strings.Cut(want[i], "\t")
		_, gj, _ := strings.Cut(got[i], "\t")
		if wj == gj {
			continue
		}
		var wa, ga any
		_ = json.Unmarshal([]byte(wj), &wa)
		_ = json.Unmarshal([]byte(gj), &ga)
		paths := jsonPaths("", wa, ga, nil)
		if len(paths) == 0 {
			paths = []string{"the same fields in another key order"}
		}
		for _, p := range paths {
			byPath[p] = append(byPath[p], wk[i])
		}
	}
	var out []string
	for _, p := range slices.Sorted(maps.Keys(byPath)) {
		out = append(out, fmt.Sprintf("%s (%d of %d: %s)", p, len(byPath[p]), len(want), strings.Join(byPath[p], ", ")))
	}
	return out
}

// jsonPaths returns where a and b differ ("metadata.managedFields missing").
func jsonPaths(at string, a, b any, out []string) []string {
	if len(out) > 6 {
		return out
	}
	am, aok := a.(map[string]any)
	bm, bok := b.(map[string]any)
	if aok && bok {
		for _, k := range slices.Sorted(maps.Keys(am)) {
			p := strings.TrimPrefix(at+"."+k, ".")
			if _, ok := bm[k]; !ok {
				out = append(out, p+" missing")
				continue
			}
			out = jsonPaths(p, am[k], bm[k], out)
		}
		for _, k := range slices.Sorted(maps.Keys(bm)) {
			if _, ok := am[k]; !ok {
				out = append(out, strings.TrimPrefix(at+"."+k, ".")+" added")
			}
		}
		return out
	}
	if fmt.Sprint(a) != fmt.Sprint(b) {
		out = append(out, fmt.Sprintf("%s %v, API server %v", at, short(fmt.Sprint(b)), short(fmt.Sprint(a))))
	}
	return out
}

// fanOut sends s to every target at once and returns their views by name.
func fanOut(ctx context.Context, s shape, extra string, floor uint64, targets []*target) map[string]view {
	var mu sync.Mutex // guards out
	out := map[string]view{}
	var wg sync.WaitGroup
	for _, tg := range targets {
		wg.Go(func() {
			v := tg.do(ctx, s, extra, floor)
			mu.Lock()
			out[tg.name] = v
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

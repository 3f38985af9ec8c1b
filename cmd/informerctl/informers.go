package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

type informersFlags struct {
	watch    bool
	interval time.Duration
}

var informersCommand = newCommand("informers", "",
	"List the daemon's informers: state, refs, objects, lag, events, holders; -w refreshes it with each one's event rate",
	func(fs *flag.FlagSet, o *informersFlags) {
		for _, n := range []string{"w", "watch"} {
			fs.BoolVar(&o.watch, n, false, "refresh every -interval until stopped: in place on a terminal, else a new table each time")
		}
		fs.DurationVar(&o.interval, "interval", 2*time.Second, "how often -w refreshes")
	}, informersCmd)

func informersCmd(ctx context.Context, e *env, o *informersFlags, args []string) error {
	if len(args) > 0 {
		return usagef("informers", "unexpected arguments %q: informers takes flags only", args)
	}
	if o.interval <= 0 {
		return usagef("informers", "-interval %s: must be positive", o.interval)
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	v := &informersView{out: e.stdout, watch: o.watch, terminal: e.terminal, width: e.width}
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for {
		resp, err := c.API().ListInformers(ctx, &informerdv1.ListInformersRequest{})
		if err != nil {
			if o.watch && ctx.Err() != nil {
				return nil // stopped
			}
			return err
		}
		if err := v.draw(resp.GetInformers(), time.Now()); err != nil || !o.watch {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// informersView prints the informers table: once; with watch, again per
// refresh (in place on a terminal, else after an empty line), with each
// informer's event rate since the previous refresh.
type informersView struct {
	out             io.Writer
	watch, terminal bool
	width           func() int // the terminal's; nil: unknown

	lines int                // the table's height on the terminal, to redraw it
	prev  map[string]reading // the previous refresh's readings, by informer
}

// reading is an informer's events_in at a time.
type reading struct {
	eventsIn uint64
	at       time.Time
}

func (v *informersView) draw(infs []*informerdv1.Informer, now time.Time) error {
	rows, next := informerRows(infs, v.prev, now, v.watch)
	v.prev = next
	var b strings.Builder
	switch {
	case v.watch && v.terminal && v.lines > 0:
		fmt.Fprintf(&b, "\x1b[%dF\x1b[J", v.lines) // back to the table's first line, and clear below
	case v.watch && !v.terminal && v.lines > 0:
		b.WriteString("\n")
	}
	var t, tb = table{}, strings.Builder{}
	_ = t.print(&tb, rows...) // a Builder does not fail
	text := tb.String()
	if v.watch && v.terminal && v.width != nil { // one row per line, or the redraw would miss the wrapped ones
		text = truncateLines(text, v.width())
	}
	v.lines = strings.Count(text, "\n")
	b.WriteString(text)
	_, err := io.WriteString(v.out, b.String())
	return writeError(err)
}

// informerRows is the informers table: a header and a row per informer.
// withRate adds RATE, each informer's events per second since its reading
// in prev ("-" without one, or when its count went back: a new informer);
// next holds this call's readings.
func informerRows(infs []*informerdv1.Informer, prev map[string]reading, now time.Time, withRate bool) (rows [][]string, next map[string]reading) {
	header := []string{"RESOURCE", "NAMESPACE", "STATE", "REFS", "OBJECTS", "RV", "LAG", "EVENTS"}
	if withRate {
		header = append(header, "RATE")
	}
	rows = [][]string{append(header, "HOLDERS", "CALLERS", "MESSAGE")}
	next = map[string]reading{}
	for _, in := range infs {
		res := resourceString(in.GetResource())
		if fs := in.GetFieldSelector(); fs != "" {
			res += " (" + fs + ")"
		}
		if in.GetEncoding() == informerdv1.Encoding_ENCODING_PROTOBUF {
			res += " (protobuf)"
		}
		ns := in.GetNamespace()
		if ns == "" {
			ns = "*"
		}
		state := in.GetState()
		if in.GetLingering() {
			state += ",lingering"
		}
		var callers []string // user (peer), once each
		for _, sub := range in.GetSubscribers() {
			if c := sub.GetUser() + " (" + sub.GetPeer() + ")"; !slices.Contains(callers, c) {
				callers = append(callers, c)
			}
		}
		row := []string{res, ns, state, strconv.Itoa(int(in.GetRefCount())), strconv.FormatInt(in.GetObjects(), 10),
			in.GetResourceVersion(), strconv.FormatInt(in.GetMaxLagEvents(), 10), strconv.FormatUint(in.GetEventsIn(), 10)}
		key := res + "\x00" + ns
		next[key] = reading{eventsIn: in.GetEventsIn(), at: now}
		if withRate {
			row = append(row, rate(prev[key], next[key]))
		}
		rows = append(rows, append(row, dash(strings.Join(in.GetHolders(), ",")), dash(strings.Join(callers, ",")), in.GetMessage()))
	}
	return rows, next
}

// rate is the events per second between two readings of an informer.
func rate(before, now reading) string {
	secs := now.at.Sub(before.at).Seconds()
	if before.at.IsZero() || secs <= 0 || now.eventsIn < before.eventsIn {
		return "-"
	}
	return strconv.FormatFloat(float64(now.eventsIn-before.eventsIn)/secs, 'f', 1, 64) + "/s"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// resourceString is r as RESOURCE.VERSION[.GROUP].
func resourceString(r *informerdv1.GroupVersionResource) string {
	s := r.GetResource() + "." + r.GetVersion()
	if r.GetGroup() != "" {
		s += "." + r.GetGroup()
	}
	return s
}

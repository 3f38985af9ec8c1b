package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/informerd/informerd/auth"
	"github.com/informerd/informerd/cache"
	"github.com/informerd/informerd/internal/handoff"
)

// A hot handoff (docs/operations.md, "Upgrade by handoff") moves a running
// daemon's work to its replacement on the node, started beside it
// (maxSurge 1): the new daemon connects to the old one's -handoff-socket,
// receives the listening socket (SCM_RIGHTS: no client is ever refused),
// every synced informer's objects and position, and what the old daemon
// holds of the API server's answers that its clients need (discovery; the
// tokens and accesses verified and not yet expired), restores them,
// serves, and answers "ok". So it serves the old daemon's clients even
// while the API server is unreachable: their streams resume, and Watch,
// Get, WatchStatus and WatchAddress answer from the informers handed off,
// each caller's token and access as trusted as on the old daemon, for no
// longer. The old daemon then ends its streams, so that its
// clients resume on the new one from the Bookmark each received at the
// handoff's position, and idles, unready, until it is stopped.
//
// Anything else starts the new daemon cold, with a log line saying why: no
// old daemon (a crash, a first start), one of another handoff version, a
// handoff that is corrupt, truncated or slower than -handoff-timeout. It
// never serves part of a handoff. It still uses a listening socket it
// received, and an old daemon that sent none (one without handoff support,
// or hung) is replaced on the socket's path, so that a surge upgrade never
// waits for the old daemon to stop.

// Answers of the new daemon, after the handoff.
const (
	handoffOK   = "ok\n"   // it serves the state handed off
	handoffCold = "cold\n" // it started cold: the old daemon resumes
)

// listenerTag tags the listening socket's descriptor.
const listenerTag = 'L'

// The handoff's extras (internal/handoff).
const (
	extraDiscovery = "discovery" // cache.HandedDiscovery, JSON
	extraAuth      = "auth"      // auth.Remembered, JSON
)

// inherited is what a new daemon took over from an old one.
type inherited struct {
	// ln is the listening socket handed over (nil: none).
	ln *net.UnixListener
	// states are the informers handed off (nil: none; start cold).
	states []handoff.Handed
	// discovery and remembered are the old daemon's discovery and
	// verified callers (nil: none).
	discovery  *cache.HandedDiscovery
	remembered *auth.Remembered
	conn       *net.UnixConn
}

// takeOver connects to the handoff socket and takes what the daemon
// serving it hands over, within timeout. It never fails: what it could not
// take, it logs, and the daemon does without.
func takeOver(path string, timeout time.Duration, maxObjectBytes int, log *slog.Logger) *inherited {
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ECONNREFUSED) {
			log.Warn("handoff: cannot reach the handoff socket: starting cold", "handoff-socket", path, "err", err)
		} else {
			log.Info("handoff: no daemon to take over from: starting cold", "handoff-socket", path)
		}
		return &inherited{}
	}
	conn := c.(*net.UnixConn)
	_ = conn.SetDeadline(time.Now().Add(timeout))
	in := &inherited{conn: conn}
	f, tag, err := handoff.RecvFile(conn, "informerd listener")
	if err == nil && tag != listenerTag {
		_ = f.Close()
		err = fmt.Errorf("a descriptor tagged %q, want %q", tag, listenerTag)
	}
	if err != nil {
		log.Warn("handoff: the old daemon handed over no listening socket: starting cold, replacing its socket", "err", err)
		in.finish(false)
		return &inherited{}
	}
	fl, err := net.FileListener(f)
	_ = f.Close()
	if ul, ok := fl.(*net.UnixListener); err == nil && ok {
		in.ln = ul
	} else {
		if err == nil {
			_ = fl.Close()
			err = fmt.Errorf("a %T, not a Unix socket", fl)
		}
		log.Warn("handoff: the descriptor handed over is not a listening Unix socket: starting cold, replacing the old daemon's socket", "err", err)
		in.finish(false)
		return &inherited{}
	}
	start := time.Now()
	got, err := handoff.Read(conn, handoff.Limits{MaxObjectBytes: maxObjectBytes})
	if err != nil {
		log.Warn("handoff: the informers' state could not be read: starting them cold (listing each)", "err", err)
		return in
	}
	in.states = got.Sources
	if in.states == nil {
		in.states = []handoff.Handed{}
	}
	objects := 0
	for _, st := range got.Sources {
		objects += len(st.Objects)
	}
	in.discovery = decodeExtra[cache.HandedDiscovery](got.Extras, extraDiscovery, log)
	in.remembered = decodeExtra[auth.Remembered](got.Extras, extraAuth, log)
	log.Info("handoff: received the old daemon's informers", "informers", len(got.Sources), "objects", objects,
		"discovery", in.discovery != nil, "verified-callers", in.remembered != nil, "took", time.Since(start))
	return in
}

// decodeExtra decodes the extra called name, or returns nil, saying why if
// it is there but does not decode: the daemon then does without it (it
// asks the API server).
func decodeExtra[T any](extras map[string][]byte, name string, log *slog.Logger) *T {
	data, ok := extras[name]
	if !ok {
		return nil
	}
	v := new(T)
	if err := json.Unmarshal(data, v); err != nil {
		log.Warn("handoff: an extra could not be decoded: doing without it, asking the API server instead", "extra", name, "err", err)
		return nil
	}
	return v
}

// finish answers the old daemon, once: ok if the new one serves the state
// handed off, cold if it does not (the old daemon then resumes).
func (in *inherited) finish(ok bool) {
	if in.conn == nil {
		return
	}
	answer := handoffCold
	if ok {
		answer = handoffOK
	}
	_, _ = in.conn.Write([]byte(answer))
	_ = in.conn.Close()
	in.conn = nil
}

// handoffServer serves a daemon's handoff socket: it hands the listening
// socket and the informers to the first daemon that connects as the same
// uid, and closes handedOff once that one says it serves them.
type handoffServer struct {
	l     *net.UnixListener
	main  *unixListener // the socket handed over
	mgr   *cache.Manager
	authn *auth.Authenticator // nil: -insecure-local-only
	authz *auth.Authorizer
	// timeout bounds one handoff.
	timeout time.Duration
	log     *slog.Logger

	handedOff chan struct{}
	wg        sync.WaitGroup
}

// serveHandoff listens on path (mode 0600, replacing what is there: the
// old daemon's, or a stale one) and hands over main, mgr's informers and
// discovery, and what authn and authz (nil: none) remember, to the daemon
// that connects. Close stops it.
func serveHandoff(path string, main *unixListener, mgr *cache.Manager, authn *auth.Authenticator, authz *auth.Authorizer, timeout time.Duration, log *slog.Logger) (*handoffServer, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	// Never removed on Close: by then the path may be the next daemon's.
	l.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return nil, err
	}
	h := &handoffServer{l: l, main: main, mgr: mgr, authn: authn, authz: authz, timeout: timeout, log: log, handedOff: make(chan struct{})}
	h.wg.Add(1)
	go h.serve()
	return h, nil
}

// serve hands off to one connection at a time until one succeeds or the
// listener closes.
func (h *handoffServer) serve() {
	defer h.wg.Done()
	for {
		c, err := h.l.AcceptUnix()
		if err != nil {
			return
		}
		if p := auth.PeerOf(c); !p.Cred || p.UID != uint32(os.Getuid()) {
			h.log.Warn("handoff: refused a connection from another user", "peer", p.String())
			_ = c.Close()
			continue
		}
		ok, err := h.handOff(c)
		_ = c.Close()
		if err != nil {
			h.log.Warn("handoff failed: serving on", "err", err)
		}
		if ok {
			close(h.handedOff)
			_ = h.l.Close()
			return
		}
	}
}

// handOff hands the listening socket and the informers over c, and
// reports whether the new daemon serves them. It freezes the informers
// for as long as it takes, and thaws them unless it succeeded.
func (h *handoffServer) handOff(c *net.UnixConn) (bool, error) {
	_ = c.SetDeadline(time.Now().Add(h.timeout))
	f, err := h.main.File()
	if err != nil {
		return false, fmt.Errorf("the listening socket: %w", err)
	}
	// From here the socket's path is the new daemon's too: never removed.
	h.main.keep.Store(true)
	err = handoff.SendFile(c, f, listenerTag)
	_ = f.Close()
	if err != nil {
		return false, fmt.Errorf("sending the listening socket: %w", err)
	}
	start := time.Now()
	frozen, thaw := h.mgr.Freeze()
	extras, err := h.extras()
	if err != nil {
		thaw()
		return false, err
	}
	objects, err := writeHandoff(c, extras, frozen)
	if err != nil {
		thaw()
		return false, fmt.Errorf("writing the informers: %w", err)
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	if answer != handoffOK {
		thaw()
		if err != nil {
			return false, fmt.Errorf("waiting for the new daemon: %w", err)
		}
		h.log.Info("handoff: the new daemon started cold: the informers resume here", "answer", strings.TrimSpace(answer))
		return false, nil
	}
	h.log.Info("handoff: the new daemon serves the informers", "informers", len(frozen), "objects", objects, "frozen-for", time.Since(start))
	return true, nil
}

// extras returns the handoff's extras: the Manager's discovery if it holds
// it whole, and the callers verified if the daemon authenticates.
func (h *handoffServer) extras() (map[string][]byte, error) {
	out := map[string][]byte{}
	if d, ok := h.mgr.HandedDiscovery(); ok {
		data, err := json.Marshal(d)
		if err != nil {
			return nil, fmt.Errorf("encoding discovery: %w", err)
		}
		out[extraDiscovery] = data
	}
	if h.authn != nil {
		data, err := json.Marshal(auth.Export(h.authn, h.authz))
		if err != nil {
			return nil, fmt.Errorf("encoding the verified callers: %w", err)
		}
		out[extraAuth] = data
	}
	return out, nil
}

// writeHandoff writes the extras, then the frozen informers, to w.
func writeHandoff(w *net.UnixConn, extras map[string][]byte, frozen []cache.Frozen) (objects int, err error) {
	hw := handoff.NewWriter(w)
	for _, name := range slices.Sorted(maps.Keys(extras)) {
		if err := hw.Extra(name, extras[name]); err != nil {
			return 0, err
		}
	}
	for _, f := range frozen {
		k := f.Key
		err := hw.WriteSource(handoff.Source{
			Group: k.GVR.Group, Version: k.GVR.Version, Resource: k.GVR.Resource,
			Namespace: k.Namespace, FieldSelector: k.FieldSelector, Protobuf: k.Protobuf,
			APIVersion: f.APIVersion, Kind: f.Kind, ResourceVersion: f.ResourceVersion, Count: f.Len,
		})
		if err != nil {
			return objects, err
		}
		for o := range f.Objects() {
			if err := hw.Object(o.Buffers()); err != nil {
				return objects, err
			}
			objects++
		}
	}
	return objects, hw.Close()
}

// Close stops serving the handoff socket (it does not remove it).
func (h *handoffServer) Close() {
	_ = h.l.Close()
	h.wg.Wait()
}

// drain waits, at most until ctx ends, for every subscriber to have taken
// every event its informer published, the handoff's Bookmark last, so that
// each resumes on the new daemon from the handoff's position: a stream
// that the daemon's shutdown ends still sends what it took.
func drain(ctx context.Context, mgr *cache.Manager) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		lagging := false
		for _, s := range mgr.Sources() {
			lagging = lagging || s.MaxLagEvents > 0
		}
		if !lagging {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

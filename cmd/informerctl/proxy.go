package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"path"
	"regexp"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/informerd/informerd/client"
	"github.com/informerd/informerd/client/wrapconfig"
)

type proxyFlags struct {
	kubeconfig, context   string
	address, unixSocket   string
	port                  int
	acceptHosts, rejected string
	strict                bool
}

// Defaults as kubectl proxy's: loopback host names only (a web page cannot
// reach the proxy through DNS rebinding), and no exec or attach.
const (
	defaultAcceptHosts = `^localhost$,^127\.0\.0\.1$,^\[::1\]$`
	defaultRejectPaths = `^/api/.*/pods/.*/exec,^/api/.*/pods/.*/attach`
)

var proxyCommand = newCommand("proxy", "", "Serve the API server's API on a local port or Unix socket, reads from the daemon, as kubectl proxy does",
	func(fs *flag.FlagSet, o *proxyFlags) {
		fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig whose credentials go with what passes through to the API server (writes, ...); default: $KUBECONFIG, ~/.kube/config, in-cluster")
		fs.StringVar(&o.context, "context", "", "the kubeconfig context; default: its current context")
		fs.StringVar(&o.address, "listen-address", "127.0.0.1", "IP address to serve on (loopback: the proxy lends the kubeconfig's credentials to whoever connects)")
		fs.IntVar(&o.port, "port", 8001, "port to serve on; 0 picks one (printed)")
		fs.StringVar(&o.unixSocket, "unix-socket", "", "serve on this Unix socket instead of a port")
		fs.StringVar(&o.acceptHosts, "accept-hosts", defaultAcceptHosts, "comma-separated regexps of the Host headers accepted")
		fs.StringVar(&o.rejected, "reject-paths", defaultRejectPaths, "comma-separated regexps of paths refused")
		fs.BoolVar(&o.strict, "strict", false, "fail what the daemon does not serve (writes included) instead of passing it to the API server")
	}, proxyCmd)

func proxyCmd(ctx context.Context, e *env, o *proxyFlags, args []string) error {
	if len(args) > 0 {
		return usagef("proxy", "unexpected arguments %q: proxy takes flags only", args)
	}
	accept, err := regexps(o.acceptHosts)
	if err != nil {
		return usagef("proxy", "-accept-hosts: %v", err)
	}
	reject, err := regexps(o.rejected)
	if err != nil {
		return usagef("proxy", "-reject-paths: %v", err)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context}).ClientConfig()
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	h, err := newProxy(cfg, c, wrapconfig.Options{ClientName: "informerctl-proxy", Strict: o.strict}, accept, reject)
	if err != nil {
		return err
	}
	var l net.Listener
	if o.unixSocket != "" {
		l, err = net.Listen("unix", o.unixSocket)
	} else {
		l, err = net.Listen("tcp", net.JoinHostPort(o.address, fmt.Sprint(o.port)))
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "Starting to serve on %s\n", l.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }() // ends when Shutdown or Close is called
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil { // watches are open: cut them
		_ = srv.Close()
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func regexps(list string) ([]*regexp.Regexp, error) {
	var out []*regexp.Regexp
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		re, err := regexp.Compile(s)
		if err != nil {
			return nil, err
		}
		out = append(out, re)
	}
	return out, nil
}

// newProxy returns the proxy's handler: requests for the API server at
// cfg.Host go through wrapconfig.Wrap's transport, so that list and
// watch requests are answered by the daemon (as the token's
// ServiceAccount) and the rest go to the API server with cfg's
// credentials. The caller's own Authorization header is dropped: the
// proxy speaks for cfg's user, as kubectl proxy. Impersonate-* headers are
// kept, as kubectl proxy keeps them: such a request goes to the API server
// (the wrapper never serves one), which decides whether cfg's user may
// impersonate, so that impersonating to narrow what one reads never reads
// more through the proxy than direct.
func newProxy(cfg *rest.Config, c *client.Client, o wrapconfig.Options, accept, reject []*regexp.Regexp) (http.Handler, error) {
	target, _, err := rest.DefaultServerUrlFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig's server: %w", err)
	}
	rt, err := rest.TransportFor(wrapconfig.Wrap(cfg, c, o))
	if err != nil {
		return nil, fmt.Errorf("the kubeconfig's transport: %w", err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = ""
			r.Out.Header.Del("Authorization")
		},
		Transport:     rt,
		FlushInterval: -1, // watches: every event as it comes
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
			if strings.Contains(h, ":") {
				host = "[" + h + "]"
			}
		}
		if !matchAny(accept, host) {
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		// The API server matches paths segment by segment and the
		// wrapper serves only clean paths: a rule for /api/... holds for
		// //api/... and /api/./... too.
		if matchAny(reject, r.URL.Path) || matchAny(reject, path.Clean("/"+r.URL.Path)) {
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		rp.ServeHTTP(w, r)
	}), nil
}

func matchAny(res []*regexp.Regexp, s string) bool {
	for _, re := range res {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

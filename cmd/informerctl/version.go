package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"

	"github.com/informerd/informerd/internal/version"
	informerdv1 "github.com/informerd/informerd/proto/informerd/v1"
)

type versionFlags struct {
	clientOnly bool
	output     string
}

var versionCommand = newCommand("version", "", "Print informerctl's version and the daemon's",
	func(fs *flag.FlagSet, o *versionFlags) {
		fs.BoolVar(&o.clientOnly, "client", false, "informerctl's version only: do not ask the daemon")
		for _, n := range []string{"o", "output"} {
			fs.StringVar(&o.output, n, "", "output format: json or yaml; empty: text")
		}
	}, versionCmd)

// versionInfo is one binary's version, as -o json prints it.
type versionInfo struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
}

func versionCmd(ctx context.Context, e *env, o *versionFlags, args []string) error {
	if len(args) > 0 {
		return usagef("version", "unexpected arguments %q: version takes flags only", args)
	}
	if o.output != "" && o.output != outputJSON && o.output != outputYAML {
		return usagef("version", "-o %q: want json or yaml (or nothing, for text)", o.output)
	}
	out := struct {
		Client versionInfo  `json:"clientVersion"`
		Server *versionInfo `json:"serverVersion,omitempty"`
	}{Client: versionInfo{Version: version.Version, GoVersion: runtime.Version()}}
	var err error
	if !o.clientOnly {
		err = func() error {
			c, err := e.dial()
			if err != nil {
				return err
			}
			defer c.Close()
			resp, err := c.API().Version(ctx, &informerdv1.VersionRequest{})
			if err != nil {
				return err
			}
			out.Server = &versionInfo{Version: resp.GetVersion(), GoVersion: resp.GetGoVersion()}
			return nil
		}()
	}
	// The client's version is printed even when the daemon's is not known.
	if o.output != "" {
		b, merr := marshal(out, o.output)
		if merr != nil {
			return merr
		}
		_, werr := e.stdout.Write(b)
		if err == nil {
			err = writeError(werr)
		}
		return err
	}
	fmt.Fprintf(e.stdout, "Client Version: %s (%s)\n", out.Client.Version, out.Client.GoVersion)
	if out.Server != nil {
		_, werr := fmt.Fprintf(e.stdout, "Server Version: %s (%s)\n", out.Server.Version, out.Server.GoVersion)
		err = writeError(werr)
	}
	return err
}

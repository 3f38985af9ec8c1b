// Package version holds the version of informerd's binaries, stamped at
// build time by `make build` and `make image`:
//
//	go build -ldflags "-X github.com/informerd/informerd/internal/version.Version=v0.1.0" ./cmd/...
package version

// Version is this build's version: the Makefile's VERSION (by default
// `git describe --tags --always --dirty`), or "devel" for a plain go build.
var Version = "devel"

// Package wrapconfig adopts informerd without changing a program: Wrap
// returns a rest.Config whose transport answers list and watch GETs from
// the node's daemon in the Kubernetes wire formats, and passes every other
// request to the API server. `informerctl proxy` serves the same transport
// on a local port for programs in other languages.
//
// It lives apart from package client, as client/statuswatcher does, so
// that a program that only needs a Watcher links neither Prometheus (which
// Options.Registerer brings) nor the HTTP emulation; package client's
// TestDependencies keeps it so. docs/adoption.md says what is served and
// how.
package wrapconfig

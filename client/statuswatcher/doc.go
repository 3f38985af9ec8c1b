// Package statuswatcher is informerd's cli-utils StatusWatcher: New returns
// a sigs.k8s.io/cli-utils/pkg/kstatus/watcher.StatusWatcher whose statuses
// the node's daemon computes (the WatchStatus RPC), once per change, from
// its shared informers, for every applier on the node. An Applier or a
// Destroyer adopts it in one line,
// apply.NewApplierBuilder().WithStatusWatcher(statuswatcher.New(c,
// statuswatcher.Options{...})), c being a client.Client of the daemon. It
// lives apart from package client, which it builds on, because cli-utils'
// watcher links controller-runtime and Prometheus, which a program that
// only needs a client.Watcher does not. docs/status.md says what it sends.
package statuswatcher

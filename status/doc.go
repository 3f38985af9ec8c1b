// Package status computes the kstatus of sets of objects for informerd's
// WatchStatus RPC, once per object per change, from the daemon's own
// informers (package cache), with the status readers of
// sigs.k8s.io/cli-utils/pkg/kstatus. It follows the semantics of
// cli-utils' StatusWatcher:
//
//   - A Watch delivers each object's status once it is known, then Synced
//     once every object's status has been delivered, then each change. An
//     object that does not exist, or whose resource the API server does not
//     serve, is NotFound.
//   - A change is a change of status, message, generation, UID, error or
//     generated resources (cli-utils' event.ResourceStatusEqual, plus the
//     UID): anything else is not delivered.
//   - Generated resources (a Deployment's ReplicaSets and their Pods; the
//     Pods of a ReplicaSet, StatefulSet, DaemonSet or Job) are read from the
//     daemon's informers through an engine.ClusterReader, never from the API
//     server, and a change to one of them recomputes the objects that
//     listed it.
//   - An object that is InProgress because a Pod (its own or a generated
//     one) is unschedulable is recomputed 15 s (kstatus' ScheduleWindow)
//     after its last change, so that kstatus can report it Failed; every
//     change restarts that timer.
//   - A resource that is not served yet (a CustomResourceDefinition not yet
//     established) is watched as soon as it is; one that stops being served
//     (its CRD was deleted) makes its objects NotFound and is watched again
//     if it comes back. Neither affects the objects of other resources.
//
// One goroutine, the Engine's loop, owns every object's state. Each object
// has one status, shared by every Watch that asks for it; objects nobody
// asks for cost nothing. The informers are held through one cache
// Subscription per (kind, namespace) that some Watch needs (a feed), and
// released when the last Watch that needs it closes. A Watch receives the
// latest status of each object that changed since its last read, and a
// wake-up: memory per Watch is bounded by its number of objects, whatever
// its reader's speed.
//
// Authorization is the caller's: a Watch reports each resource it will read
// (an Access) as soon as the resource is known, and delivers nothing
// computed from a resource until the caller has granted that Access. A feed
// starts its upstream informer only once some Watch has granted it, and
// only of the version granted: a CRD deleted and created again serving
// another version is a new Access, reported and granted before the feed
// subscribes to it.
//
// This package knows no gRPC; package daemon translates.
package status

// Package address answers "who is behind ip:port?" for data-plane proxies,
// from one pod subscription of the cache shared by every watcher, and sends
// an answer only when it changes.
//
// # Answers
//
// The pod behind an address is found through indexes kept over the pod
// informer, never by a scan:
//
//   - by pod IP: an address whose IP is one of a pod's IPs is that pod, on
//     any port (a pod may listen on ports it does not declare); the answer's
//     Port is the container port the pod declares with that number, if any.
//     Host-network pods share their node's IP and are not found this way.
//   - else by host IP and hostPort: a declared port with a hostPort (every
//     declared port of a host-network pod) is reachable on the pod's host
//     IPs, or on the port's own hostIP when it sets one.
//
// Only live pods are answers: a pod that is terminating (it has a
// deletionTimestamp) or finished (Succeeded or Failed) is not, so a pod
// replaced behind a hostPort is reported as no pod until its replacement
// holds the address. Pending pods that already hold the address are
// answers, with Ready false.
//
// When several live pods claim one address (a transient state: an IP reused
// while an old pod's status is stale, two pods racing for a hostPort), the
// answer is the ready one, else the running one, else the most recently
// created one, ties broken by namespace and name; Claimants says how many
// claim it. When several container ports of the chosen pod match, TCP is
// preferred, then the first declared.
//
// # Related objects
//
// A RelatedKind names objects that select pods and ports (a Linkerd Server,
// for example): the field path of their pod label selector, of the port
// they select (by number or by container port name), and of fields to
// project into answers. An object selects the pods of its own namespace (a
// cluster-scoped one, of every namespace) whose labels its selector
// matches, on the port it names (every port if it names none). Any change
// of such an object recomputes the answers of the pods it selected before
// or selects now from the full current set of objects, so an object whose
// selector stopped matching leaves the answer.
//
// A kind the API server does not serve (its CustomResourceDefinition is not
// installed) has no objects; answers gain them once it is served. A kind
// that cannot be read otherwise (the daemon may not list it, the informer
// stopped) fails nothing: answers lack its objects and name it in
// Unavailable, with the cause, and it is retried until it is read. A
// watch may withhold kinds (its caller may not read them): its answers
// never carry their objects and name them Unavailable.
//
// # Workloads
//
// A watch may ask for the pod's workload: the controller of its ReplicaSet
// or Job (a Deployment, a CronJob), else its controller. The first such
// watch opens one subscription to ReplicaSets and one to Jobs, shared by
// every such watch and closed with the last; the others never pay for
// them, and see no workload.
//
// # Changes only
//
// A Watch returns the first answer once the pods and every related kind
// have synced (or been found unreadable), and for a watch of the workload
// the ReplicaSets and Jobs too, then each answer that differs from the last one it
// returned, seen through the watcher's label keys: a pod event that changes
// nothing in the answer returns nothing, and no answer is returned twice in
// a row. A watcher that reads slowly gets the latest answer, never a queue
// of stale ones.
//
// # Concurrency
//
// One goroutine per subscription (pods, each related kind, ReplicaSets
// and Jobs while a watch asks for workloads) reads the
// cache's events in order and decodes them into small structs; one goroutine
// owns the indexes and applies them, batch by batch, recomputing only the
// addresses a batch touched, once each. Each watched address holds its
// current answer in a slot with a channel closed on change, so notifying
// its watchers costs the same whatever their number and never blocks.
//
// This package knows no gRPC; package daemon serves it.
package address

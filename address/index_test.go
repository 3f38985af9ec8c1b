package address

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func syncedIndex(kinds ...RelatedKind) *index {
	x := newIndex(kinds)
	x.synced = true
	return x
}

// answerOf is the published answer of addr's entry.
func answerOf(x *index, addr string) string {
	return describe(x.entries[ap(addr)].state.Load().answer)
}

func TestResolve(t *testing.T) {
	web := []corev1.ContainerPort{
		{Name: "dns-udp", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
		{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP},
		{Name: "http", ContainerPort: 8080, HostPort: 30080},
		{Name: "admin", ContainerPort: 9990, HostPort: 30990, HostIP: "192.168.0.9"},
	}
	tests := []struct {
		name string
		pods []podOpts
		addr string
		want string
	}{
		{"pod IP, declared port", []podOpts{{name: "a", ip: "10.0.0.1", hostIP: "192.168.0.1", ports: web}}, "10.0.0.1:8080",
			"ns/a uid=a-uid Running ready=true match=1 claimants=1 port=http/8080/30080/TCP"},
		{"pod IP, TCP preferred", []podOpts{{name: "a", ip: "10.0.0.1", ports: web}}, "10.0.0.1:53",
			"ns/a uid=a-uid Running ready=true match=1 claimants=1 port=dns-tcp/53/0/TCP"},
		{"pod IP, undeclared port is still the pod", []podOpts{{name: "a", ip: "10.0.0.1", ports: web}}, "10.0.0.1:7777",
			"ns/a uid=a-uid Running ready=true match=1 claimants=1"},
		{"host IP and hostPort", []podOpts{{name: "a", ip: "10.0.0.1", hostIP: "192.168.0.1", ports: web}}, "192.168.0.1:30080",
			"ns/a uid=a-uid Running ready=true match=2 claimants=1 port=http/8080/30080/TCP"},
		{"host IP, port that is no hostPort", []podOpts{{name: "a", ip: "10.0.0.1", hostIP: "192.168.0.1", ports: web}}, "192.168.0.1:8080",
			"none"},
		{"hostPort bound to its own hostIP", []podOpts{{name: "a", ip: "10.0.0.1", hostIP: "192.168.0.1", ports: web}}, "192.168.0.9:30990",
			"ns/a uid=a-uid Running ready=true match=2 claimants=1 port=admin/9990/30990/TCP"},
		{"hostPort bound elsewhere is not on the pod's host IP", []podOpts{{name: "a", ip: "10.0.0.1", hostIP: "192.168.0.1", ports: web}}, "192.168.0.1:30990",
			"none"},
		{"host network: declared ports on the host", []podOpts{{name: "h", ip: "192.168.0.1", hostIP: "192.168.0.1", hostNetwork: true, ports: []corev1.ContainerPort{tcp("metrics", 9100)}}},
			"192.168.0.1:9100", "ns/h uid=h-uid Running ready=true match=2 claimants=1 port=metrics/9100/9100/TCP"},
		{"host network: not found by IP on other ports", []podOpts{{name: "h", ip: "192.168.0.1", hostIP: "192.168.0.1", hostNetwork: true, ports: []corev1.ContainerPort{tcp("metrics", 9100)}}},
			"192.168.0.1:22", "none"},
		{"pending pod that holds the address", []podOpts{{name: "a", ip: "10.0.0.1", phase: corev1.PodPending}}, "10.0.0.1:80",
			"ns/a uid=a-uid Pending ready=false match=1 claimants=1"},
		{"running, not ready", []podOpts{{name: "a", ip: "10.0.0.1", notReady: true}}, "10.0.0.1:80",
			"ns/a uid=a-uid Running ready=false match=1 claimants=1"},
		{"terminating pod is no answer", []podOpts{{name: "a", ip: "10.0.0.1", deleting: true}}, "10.0.0.1:80", "none"},
		{"succeeded pod is no answer", []podOpts{{name: "a", ip: "10.0.0.1", phase: corev1.PodSucceeded}}, "10.0.0.1:80", "none"},
		{"failed pod is no answer", []podOpts{{name: "a", ip: "10.0.0.1", phase: corev1.PodFailed}}, "10.0.0.1:80", "none"},
		{"nobody", []podOpts{{name: "a", ip: "10.0.0.1"}}, "10.0.0.2:80", "none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := syncedIndex()
			for _, o := range tt.pods {
				x.setPod(objKey{"ns", o.name}, decoded(t, o))
			}
			if got := describe(x.resolve(ap(tt.addr))); got != tt.want {
				t.Fatalf("answer for %s:\n got %s\nwant %s", tt.addr, got, tt.want)
			}
		})
	}
}

// TestConflictRule: when several live pods claim an address, the ready one
// wins, else the running one, else the newest, else the first by
// namespace and name; claimants counts them all.
func TestConflictRule(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	older, newer := t0, t0.Add(time.Hour)
	tests := []struct {
		name string
		pods []podOpts
		want string
	}{
		{"ready beats newer", []podOpts{{name: "old", created: older}, {name: "new", created: newer, notReady: true}}, "old"},
		{"running beats pending", []podOpts{{name: "pending", phase: corev1.PodPending, created: newer}, {name: "running", notReady: true, created: older}}, "running"},
		{"newest of equals", []podOpts{{name: "a", created: older}, {name: "b", created: newer}}, "b"},
		{"name breaks ties", []podOpts{{name: "b", created: older}, {name: "a", created: older}}, "a"},
		{"terminating claimant does not count", []podOpts{{name: "a", created: older}, {name: "b", created: newer, deleting: true}}, "a"},
	}
	for _, tt := range tests {
		for _, via := range []string{"10.0.0.1:80", "192.168.0.1:30080"} {
			t.Run(tt.name+" via "+via, func(t *testing.T) {
				x := syncedIndex()
				live := 0
				for _, o := range tt.pods {
					o.ip, o.hostIP, o.ports = "10.0.0.1", "192.168.0.1", []corev1.ContainerPort{{Name: "http", ContainerPort: 80, HostPort: 30080}}
					if via != "10.0.0.1:80" {
						o.ip = "" // found by host port only
					}
					p := decoded(t, o)
					if p != nil {
						live++
					}
					x.setPod(objKey{"ns", o.name}, p)
				}
				a := x.resolve(ap(via))
				if a.Pod == nil || a.Pod.Name != tt.want || a.Claimants != live {
					t.Fatalf("answer %s, want pod %s with %d claimants", describe(a), tt.want, live)
				}
			})
		}
	}
}

// TestOnlyChangesArePublished: each pod change publishes only to the
// addresses it touches, and only when their answer changed.
func TestOnlyChangesArePublished(t *testing.T) {
	x := syncedIndex()
	web := podOpts{name: "web", ip: "10.0.0.1", hostIP: "192.168.0.1", labels: map[string]string{"app": "web"},
		ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, HostPort: 30080}}}
	x.setPod(objKey{"ns", "web"}, decoded(t, web))
	x.add(ap("10.0.0.1:8080"), nil)
	x.add(ap("192.168.0.1:30080"), nil)
	x.add(ap("10.0.0.9:80"), nil)

	steps := []struct {
		name      string
		key       string
		pod       *podOpts // nil: deleted
		published int
	}{
		{"annotation only", "web", &podOpts{name: "web", ip: "10.0.0.1", hostIP: "192.168.0.1", labels: map[string]string{"app": "web"},
			ports: web.ports, annotations: map[string]string{"touched": "1"}}, 0},
		{"another pod", "other", &podOpts{name: "other", ip: "10.0.0.2"}, 0},
		{"another pod again", "other", &podOpts{name: "other", ip: "10.0.0.2", annotations: map[string]string{"x": "y"}}, 0},
		{"readiness flips: both addresses", "web", &podOpts{name: "web", ip: "10.0.0.1", hostIP: "192.168.0.1", labels: map[string]string{"app": "web"},
			ports: web.ports, notReady: true}, 2},
		{"readiness flips back", "web", &web, 2},
		{"label change", "web", &podOpts{name: "web", ip: "10.0.0.1", hostIP: "192.168.0.1", labels: map[string]string{"app": "web", "v": "2"},
			ports: web.ports}, 2},
		{"a pod appears at the empty address", "late", &podOpts{name: "late", ip: "10.0.0.9"}, 1},
		{"terminating", "late", &podOpts{name: "late", ip: "10.0.0.9", deleting: true}, 1},
		{"deleted after terminating", "late", nil, 0},
	}
	for _, s := range steps {
		var p *Pod
		if s.pod != nil {
			p = decoded(t, *s.pod)
		}
		x.setPod(objKey{"ns", s.key}, p)
		if got := x.flush(); got != s.published {
			t.Fatalf("%s: %d answers published, want %d", s.name, got, s.published)
		}
	}
	if got := answerOf(x, "10.0.0.9:80"); got != "none" {
		t.Fatalf("10.0.0.9:80 = %s, want none", got)
	}
}

// TestHostPortReplaced: a pod replaced behind a hostPort is no pod until
// the new one holds the address.
func TestHostPortReplaced(t *testing.T) {
	x := syncedIndex()
	x.add(ap("192.168.0.1:30080"), nil)
	ports := []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, HostPort: 30080}}
	var seen []string
	step := func(key string, o *podOpts) {
		var p *Pod
		if o != nil {
			o.ports = ports
			p = decoded(t, *o)
		}
		x.setPod(objKey{"ns", key}, p)
		if x.flush() > 0 {
			seen = append(seen, answerOf(x, "192.168.0.1:30080"))
		}
	}
	step("a", &podOpts{name: "a", uid: "1", phase: corev1.PodPending}) // scheduled, no host IP yet
	step("a", &podOpts{name: "a", uid: "1", ip: "10.0.0.1", hostIP: "192.168.0.1"})
	step("a", &podOpts{name: "a", uid: "1", ip: "10.0.0.1", hostIP: "192.168.0.1", deleting: true})
	step("a", nil)
	step("a", &podOpts{name: "a", uid: "2", phase: corev1.PodPending})
	step("a", &podOpts{name: "a", uid: "2", ip: "10.0.0.5", hostIP: "192.168.0.1"})
	want := []string{
		"ns/a uid=1 Running ready=true match=2 claimants=1 port=http/8080/30080/TCP",
		"none",
		"ns/a uid=2 Running ready=true match=2 claimants=1 port=http/8080/30080/TCP",
	}
	if !slices.Equal(seen, want) {
		t.Fatalf("answers:\n got %q\nwant %q", seen, want)
	}
}

// TestRelatedObjects: related objects enter and leave answers as they
// start and stop selecting the pod and port, recomputed from the full set.
func TestRelatedObjects(t *testing.T) {
	x := syncedIndex(servers)
	web := map[string]string{"app": "web"}
	x.setPod(objKey{"ns", "web"}, decoded(t, podOpts{name: "web", ip: "10.0.0.1", labels: web,
		ports: []corev1.ContainerPort{tcp("http", 8080), tcp("admin", 9990)}}))
	x.setPod(objKey{"other", "web"}, decoded(t, podOpts{ns: "other", name: "web", ip: "10.0.0.2", labels: web}))
	x.add(ap("10.0.0.1:8080"), nil)
	x.add(ap("10.0.0.1:9990"), nil)
	x.add(ap("10.0.0.2:8080"), nil)

	steps := []struct {
		name      string
		key       objKey
		obj       *relObj
		published int
		http      string // the related part of 10.0.0.1:8080's answer
	}{
		{"selects by port name", objKey{"ns", "s1"}, decodedServer(t, "ns", "s1", web, "http", "opaque"), 1, " related=ns/s1map[spec.proxyProtocol:\"opaque\"]"},
		{"projected field changes", objKey{"ns", "s1"}, decodedServer(t, "ns", "s1", web, "http", "HTTP/2"), 1, " related=ns/s1map[spec.proxyProtocol:\"HTTP/2\"]"},
		{"update changing nothing the answer carries", objKey{"ns", "s1"}, decodedServer(t, "ns", "s1", web, "http", "HTTP/2"), 0, " related=ns/s1map[spec.proxyProtocol:\"HTTP/2\"]"},
		{"second one, by number", objKey{"ns", "s2"}, decodedServer(t, "ns", "s2", web, 8080, "opaque"), 1,
			" related=ns/s1map[spec.proxyProtocol:\"HTTP/2\"] related=ns/s2map[spec.proxyProtocol:\"opaque\"]"},
		{"selector stops matching", objKey{"ns", "s1"}, decodedServer(t, "ns", "s1", map[string]string{"app": "db"}, "http", "HTTP/2"), 1,
			" related=ns/s2map[spec.proxyProtocol:\"opaque\"]"},
		{"non-matching one deleted", objKey{"ns", "s1"}, nil, 0, " related=ns/s2map[spec.proxyProtocol:\"opaque\"]"},
		{"other port only", objKey{"ns", "s3"}, decodedServer(t, "ns", "s3", web, "admin", "opaque"), 1, " related=ns/s2map[spec.proxyProtocol:\"opaque\"]"},
		{"matching one deleted", objKey{"ns", "s2"}, nil, 1, ""},
		{"no selector selects nothing", objKey{"ns", "s4"}, decodedServer(t, "ns", "s4", nil, nil, "opaque"), 0, ""},
		{"empty selector, no port: everything in the namespace", objKey{"ns", "s5"}, decodedServer(t, "ns", "s5", map[string]string{}, nil, "opaque"), 2,
			" related=ns/s5map[spec.proxyProtocol:\"opaque\"]"},
	}
	for _, s := range steps {
		x.setRelated(0, s.key, s.obj)
		if got := x.flush(); got != s.published {
			t.Fatalf("%s: %d answers published, want %d", s.name, got, s.published)
		}
		want := "ns/web uid=web-uid Running ready=true match=1 claimants=1 port=http/8080/0/TCP" + s.http
		if got := answerOf(x, "10.0.0.1:8080"); got != want {
			t.Fatalf("%s: answer\n got %s\nwant %s", s.name, got, want)
		}
	}
	if got := answerOf(x, "10.0.0.2:8080"); got != "other/web uid=web-uid Running ready=true match=1 claimants=1" {
		t.Fatalf("a pod of another namespace got related objects: %s", got)
	}
	if got := answerOf(x, "10.0.0.1:9990"); got != "ns/web uid=web-uid Running ready=true match=1 claimants=1 port=admin/9990/0/TCP related=ns/s3map[spec.proxyProtocol:\"opaque\"] related=ns/s5map[spec.proxyProtocol:\"opaque\"]" {
		t.Fatalf("admin port: %s", got)
	}
	// A pod label change recomputes its related objects too.
	x.setPod(objKey{"ns", "web"}, decoded(t, podOpts{name: "web", ip: "10.0.0.1", labels: map[string]string{"app": "db"},
		ports: []corev1.ContainerPort{tcp("http", 8080), tcp("admin", 9990)}}))
	if got := x.flush(); got != 2 {
		t.Fatalf("label change published %d answers, want 2", got)
	}
	if got := answerOf(x, "10.0.0.1:9990"); got != "ns/web uid=web-uid Running ready=true match=1 claimants=1 port=admin/9990/0/TCP related=ns/s5map[spec.proxyProtocol:\"opaque\"]" {
		t.Fatalf("after the label change: %s", got)
	}
}

func TestRelatedDecode(t *testing.T) {
	tests := []struct {
		name    string
		spec    string
		wantErr bool
		check   func(*relObj) bool
	}{
		{"match expressions", `{"podSelector":{"matchExpressions":[{"key":"app","operator":"In","values":["web"]}]},"port":8080}`, false,
			func(r *relObj) bool { return r.selector != nil && r.port.IntValue() == 8080 }},
		{"bad operator selects nothing", `{"podSelector":{"matchExpressions":[{"key":"app","operator":"Near"}]}}`, true,
			func(r *relObj) bool { return r.selector == nil }},
		{"port out of range", `{"podSelector":{},"port":70000}`, true, func(r *relObj) bool { return r.selector == nil }},
		{"selector of the wrong type", `{"podSelector":"app=web"}`, false, func(r *relObj) bool { return r.selector == nil }},
		{"projected object field", `{"podSelector":{},"proxyProtocol":{"a":[1,2.5]}}`, false,
			func(r *relObj) bool { return r.fields["spec.proxyProtocol"] == `{"a":[1,2.5]}` }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := serverObject(t, "ns", "s", nil, nil, "")
			o.Data = []byte(`{"apiVersion":"policy.test/v1","kind":"Server","metadata":{"name":"s","namespace":"ns"},"spec":` + tt.spec + `}`)
			r, err := servers.decode(o)
			if (err != nil) != tt.wantErr || r == nil || !tt.check(r) {
				t.Fatalf("decode = %+v, %v", r, err)
			}
		})
	}
}

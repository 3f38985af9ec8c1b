package fieldsel

import "testing"

func TestOneObject(t *testing.T) {
	for _, tc := range []struct {
		sel, ns, want string
		ok            bool
	}{
		{sel: "metadata.name=a", want: "a", ok: true},
		{sel: "metadata.name==a", ns: "ns", want: "a", ok: true},
		{sel: "metadata.namespace=ns,metadata.name=a", ns: "ns", want: "a", ok: true},
		{sel: "metadata.name=a,metadata.namespace=other", ns: "ns"},
		{sel: "metadata.name=a,metadata.namespace=ns"}, // every namespace: one object per namespace
		{sel: "metadata.name!=a"},
		{sel: "metadata.name=a,metadata.name=b"},
		{sel: "metadata.name=a,spec.nodeName=n"},
		{sel: "metadata.namespace=ns", ns: "ns"},
		{sel: "spec.nodeName=n"},
		{sel: ""},
	} {
		got, ok := OneObject(tc.sel, tc.ns)
		if got != tc.want || ok != tc.ok {
			t.Errorf("OneObject(%q, %q) = %q, %v; want %q, %v", tc.sel, tc.ns, got, ok, tc.want, tc.ok)
		}
	}
}

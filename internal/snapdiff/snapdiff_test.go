package snapdiff

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// obj is a test object: name, uid, resourceVersion.
type obj struct{ name, uid, rv string }

var accessors = Accessors[obj]{
	Compare:         func(a, b obj) int { return strings.Compare(a.name, b.name) },
	ResourceVersion: func(o obj) string { return o.rv },
	UID:             func(o obj) string { return o.uid },
}

// parse reads "name/uid@rv ..." into objects.
func parse(s string) []obj {
	var out []obj
	for f := range strings.FieldsSeq(s) {
		name, rest, _ := strings.Cut(f, "/")
		uid, rv, _ := strings.Cut(rest, "@")
		out = append(out, obj{name, uid, rv})
	}
	return out
}

func TestDiff(t *testing.T) {
	for _, tt := range []struct {
		name     string
		old, new string
		want     []string
	}{
		{name: "both empty"},
		{name: "unchanged", old: "a/1@1 b/2@2", new: "a/1@1 b/2@2"},
		{name: "first snapshot", new: "b/2@2 a/1@1", want: []string{"ADDED a/1@1", "ADDED b/2@2"}},
		{name: "all gone", old: "a/1@1 b/2@2", want: []string{"DELETED a/1@1", "DELETED b/2@2"}},
		{name: "modified", old: "a/1@1 b/2@2", new: "a/1@5 b/2@2", want: []string{"MODIFIED a/1@5"}},
		{
			name: "re-created under its name: deleted then added",
			old:  "a/1@1", new: "a/9@5",
			want: []string{"DELETED a/1@1", "ADDED a/9@5"},
		},
		{
			name: "deletions first, then changes by resourceVersion",
			old:  "a/1@1 b/2@2 c/3@3 d/4@4 e/5@5",
			new:  "a/1@1 b/2@9 c/6@7 f/7@8 g/8@12",
			want: []string{"DELETED c/3@3", "DELETED d/4@4", "DELETED e/5@5", "ADDED c/6@7", "ADDED f/7@8", "MODIFIED b/2@9", "ADDED g/8@12"},
		},
		{
			name: "resourceVersions compared as numbers",
			old:  "a/1@1", new: "a/1@10 b/2@9",
			want: []string{"ADDED b/2@9", "MODIFIED a/1@10"},
		},
		{
			name: "opaque resourceVersions: key order",
			old:  "a/1@x b/2@y", new: "a/1@z b/2@w c/3@v",
			want: []string{"MODIFIED a/1@z", "MODIFIED b/2@w", "ADDED c/3@v"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			next := parse(tt.new)
			Sort(next, accessors.Compare)
			var got []string
			for _, c := range Diff(slices.Values(parse(tt.old)), next, accessors) {
				got = append(got, fmt.Sprintf("%s %s/%s@%s", c.Type, c.Object.name, c.Object.uid, c.Object.rv))
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Diff(%q, %q) = %q, want %q", tt.old, tt.new, got, tt.want)
			}
		})
	}
}

// TestDiffReadsUIDsOnlyWhenNeeded: the cache reads a uid by decoding the
// object, so Diff reads one only for a key in both snapshots whose
// resourceVersion changed.
func TestDiffReadsUIDsOnlyWhenNeeded(t *testing.T) {
	a := accessors
	var read []string
	a.UID = func(o obj) string { read = append(read, o.name+"@"+o.rv); return o.uid }
	next := parse("a/1@1 b/2@3 c/3@4")
	Diff(slices.Values(parse("a/1@1 b/2@2 d/4@4")), next, a)
	if want := []string{"b@3", "b@2"}; !slices.Equal(read, want) {
		t.Errorf("uids read: %q, want %q", read, want)
	}
}
